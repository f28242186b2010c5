"""The result file of a stored experiment as typed records, version 2.

``results/NAME.json`` (``"format": "fvlib-experiment"``, ``"version": 2``) is a
:class:`ResultFile`::

    experiment, description, chapter   what the file holds (from the experiment's definition)
    planned_runs                       the keys of every run the definition plans
    rules                              Rules: the convergence, tolerance, prefix and theory
                                       tolerance rules the file was written under
    theory_kind                        the shape of ``theory`` (THEORY_KINDS), or null
    theory                             the references (JSON values, as the chapters read them),
                                       or null before they are computed
    theory_provenance                  Provenance of the references' computation, or null
    runs                               {key: RunRecord}

A :class:`RunRecord` holds a run's labels, its complete config (every field of
:class:`~fvlib.training.config.TrainConfig`), its final numbers, its :class:`Attempt` list (one
per doubling), its evaluation history, its ``greedy_paired`` and ``gap`` analyses (null where
not computed) and the :class:`Provenance` of the work item that trained it (with ``earlier``:
those of the items that trained its earlier attempts).

Version 1 files (every file stored before this schema) are read by :meth:`ResultFile.from_dict`
into version 2: their rules move under ``rules`` (a rule the file lacks is null), their theory's
shape is named (:func:`theory_kind`: the depth sweeps' curves, the per-budget tasks of
``recipes-a``, the references by model), their configs are completed with the values of the
fields added since (:data:`~fvlib.training.config.ADDED_FIELDS`, which change nothing), and the
optional fields of provenances and runs are filled with null. No number changes.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, dataclass, field, fields

from ..training import TrainConfig
from .rules import CONVERGENCE_DROP, PREFIX_RULE, THEORY_TOLERANCE_RULE, TOLERANCE_RULE

__all__ = ["FORMAT", "THEORY_KINDS", "VERSION", "Attempt", "Provenance", "ResultError", "ResultFile", "Rules",
           "RunRecord", "new_result", "theory_kind"]

FORMAT = "fvlib-experiment"
VERSION = 2
#: The shapes of a result file's ``theory``: ``depth-sweep`` (``budgets``, ``curves``,
#: ``noisefree``, ``tau2``), ``per-budget`` (one task per budget, ``M<budget>``: the strategies),
#: ``references`` (``MODEL/PRIOR``: each model's matching reference; ``tree``: the strategies).
THEORY_KINDS = ("depth-sweep", "per-budget", "references")


class ResultError(ValueError):
    """A result file that is missing, corrupt or of another experiment definition."""


def _checked(cls, data, where: str) -> dict:
    """``data``'s fields for dataclass ``cls``: a mapping with every required field and no other."""
    if not isinstance(data, dict):
        raise ResultError(f"{where} must be a mapping, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ResultError(f"{where} has unknown fields {unknown}")
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    missing = sorted(required - set(data))
    if missing:
        raise ResultError(f"{where} lacks the fields {missing}")
    return data


@dataclass
class Attempt:
    """One training of a run: its steps, final evaluation loss and whether it converged."""

    steps: int
    final_loss: float
    converged: bool

    @classmethod
    def from_dict(cls, data: dict, where: str = "attempt") -> Attempt:
        return cls(**_checked(cls, data, where))

    def to_dict(self) -> dict:
        return {"steps": self.steps, "final_loss": self.final_loss, "converged": self.converged}


@dataclass
class Provenance:
    """Where and how a work item (or a theory block) was computed
    (:func:`fvlib.experiments.provenance.provenance`). ``item``, ``runs_in_item``,
    ``resumed_seconds``: the work item (null for a theory block, and ``resumed_seconds`` for the
    runs stored before it was recorded); ``earlier``: the provenances of the items that trained
    a run's earlier attempts."""

    fvlib: str
    commit: str | None
    fvlib_modified: bool | None
    torch: str
    python: str
    device: str
    device_name: str
    threads: int
    wall_seconds: float
    cpu_seconds: float
    date: str
    item: str | None = None
    runs_in_item: int | None = None
    resumed_seconds: float | None = None
    earlier: list[Provenance] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict, where: str = "provenance") -> Provenance:
        data = dict(_checked(cls, data, where))
        data["earlier"] = [cls.from_dict(p, f"{where}/earlier/{i}") for i, p in enumerate(data.get("earlier", []))]
        return cls(**data)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["earlier"] = [p.to_dict() for p in self.earlier]
        return out


@dataclass
class RunRecord:
    """One stored run (:mod:`fvlib.experiments.runner`): labels, complete config, final numbers,
    attempts, evaluation history (``step``, ``lr``, ``train_loss``, ``eval_excess_loss``,
    ``eval_stderr``, ``eval_query_loss``, ``seconds`` per evaluation), analyses, provenance."""

    key: str
    variant: str
    prior: str
    budget: int
    seed: int
    config: dict
    final_loss: float
    final_stderr: float
    final_query_loss: float
    steps: int
    converged: bool
    attempts: list[Attempt]
    history: list[dict]
    provenance: Provenance
    greedy_paired: dict | None = None
    gap: dict | None = None

    @classmethod
    def from_dict(cls, data: dict, where: str = "run") -> RunRecord:
        data = dict(_checked(cls, data, where))
        try:
            data["config"] = TrainConfig.from_dict(data["config"]).to_dict()
        except (TypeError, ValueError) as err:
            raise ResultError(f"{where}/config: {err}") from None
        data["attempts"] = [Attempt.from_dict(a, f"{where}/attempts/{i}") for i, a in enumerate(data["attempts"])]
        data["provenance"] = Provenance.from_dict(data["provenance"], f"{where}/provenance")
        return cls(**data)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["attempts"] = [a.to_dict() for a in self.attempts]
        out["provenance"] = self.provenance.to_dict()
        return out


#: Version 1's top-level rule fields, by their name under version 2's ``rules``.
V1_RULES = {"convergence": "convergence_rule", "tolerance": "tolerance_rule", "prefix": "prefix_rule",
            "theory_tolerance": "theory_tolerance_rule"}


@dataclass
class Rules:
    """The rules a result file was written under, in words (:mod:`fvlib.experiments.rules`);
    null: a file written before the rule was stated."""

    convergence: str | None = None
    tolerance: str | None = None
    prefix: str | None = None
    theory_tolerance: str | None = None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def theory_kind(theory: dict | None) -> str | None:
    """The shape of a theory block (:data:`THEORY_KINDS`), or ``None`` for no theory."""
    if theory is None:
        return None
    if "curves" in theory:
        return "depth-sweep"
    if "tree" in theory:
        return "references"
    if any(re.fullmatch(r"M\d+", k) for k in theory):
        return "per-budget"
    raise ResultError(f"a theory block of unknown shape (keys {sorted(theory)})")


@dataclass
class ResultFile:
    """A stored experiment's result file (module docs); :meth:`from_dict` reads versions 1 and 2."""

    experiment: str
    description: str
    chapter: str
    planned_runs: list[str]
    rules: Rules
    theory_kind: str | None
    theory: dict | None
    theory_provenance: Provenance | None
    runs: dict[str, RunRecord]

    @classmethod
    def from_dict(cls, data: dict, where: str = "result") -> ResultFile:
        """Read a result file's JSON (version 1 turned into version 2); raises :class:`ResultError`
        naming ``where`` and the field when it is not a result file."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ResultError(f"{where} is not a result file (format {FORMAT!r})")
        version = data.get("version")
        if version == 1:
            data = _upgrade_v1(data)
        elif version != VERSION:
            raise ResultError(f"{where}: unknown result file version {version!r} (this fvlib reads 1 and {VERSION})")
        body = {k: v for k, v in data.items() if k not in ("format", "version")}
        body = dict(_checked(cls, body, where))
        body["rules"] = Rules(**_checked(Rules, body["rules"], f"{where}/rules"))
        if body["theory_kind"] not in (None, *THEORY_KINDS):
            raise ResultError(f"{where}: theory_kind must be one of {THEORY_KINDS} or null, "
                              f"got {body['theory_kind']!r}")
        if body["theory_provenance"] is not None:
            body["theory_provenance"] = Provenance.from_dict(body["theory_provenance"], f"{where}/theory_provenance")
        body["runs"] = {k: RunRecord.from_dict(r, f"{where}/runs/{k}") for k, r in body["runs"].items()}
        return cls(**body)

    def to_dict(self) -> dict:
        """The version-2 JSON of the file."""
        return {"format": FORMAT, "version": VERSION, "experiment": self.experiment,
                "description": self.description, "chapter": self.chapter, "planned_runs": list(self.planned_runs),
                "rules": self.rules.to_dict(), "theory_kind": self.theory_kind, "theory": self.theory,
                "theory_provenance": None if self.theory_provenance is None else self.theory_provenance.to_dict(),
                "runs": {k: r.to_dict() for k, r in self.runs.items()}}


def _upgrade_v1(data: dict) -> dict:
    """A version-1 result file's JSON as version 2's (module docs); no number changes."""
    out = {k: v for k, v in data.items() if k not in V1_RULES.values()}
    out["version"] = VERSION
    out["rules"] = {new: data.get(old) for new, old in V1_RULES.items()}
    out["theory_kind"] = theory_kind(data.get("theory"))
    out.setdefault("theory_provenance", None)
    return out


def new_result(experiment) -> ResultFile:
    """An empty result file of ``experiment`` (a :class:`~fvlib.experiments.definitions.Experiment`),
    stating today's rules."""
    return ResultFile(
        experiment=experiment.name, description=experiment.description, chapter=experiment.chapter,
        planned_runs=[r.key for r in experiment.runs],
        rules=Rules(convergence=f"the evaluation loss fell by less than {CONVERGENCE_DROP:.0%} over the last "
                                f"fifth of the steps; otherwise retrained with twice the steps, at most "
                                f"{experiment.max_doublings} times",
                    tolerance=TOLERANCE_RULE, prefix=PREFIX_RULE.format(rtol=experiment.prefix_rtol),
                    theory_tolerance=THEORY_TOLERANCE_RULE),
        theory_kind=None, theory=None, theory_provenance=None, runs={})
