"""The result file of a stored experiment as typed records, version 3 (sealed).

``results/NAME.json`` (``"format": "fvlib-experiment"``, ``"version": 3``) is a
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
    seal                               the SHA-256 of each part of the file and of the files
                                       beside it (:mod:`fvlib.experiments.seal`)

A :class:`RunRecord` holds a run's labels, its complete config (every field of
:class:`~fvlib.training.config.TrainConfig`), its final numbers, its :class:`Attempt` list (one
per doubling), its evaluation history, its ``greedy_paired`` and ``gap`` analyses (null where
not computed) and the :class:`Provenance` of the work item that trained it (with ``earlier``:
those of the items that trained its earlier attempts).

:meth:`ResultFile.from_dict` checks every field's type: a string where a string is due, an
integer (not a bool) for steps, seeds and budgets, a finite number (no NaN, infinity, null or
string) for every loss, standard error, time and reference value. Null is allowed exactly where
the store writes it: a run's ``greedy_paired`` and ``gap`` (not computed), ``train_loss`` at step
0 of a history, the optional fields of a provenance, an attempt's ``drop`` and ``drop_stderr``
(the paired-doubling rule: null for a run's first attempt), a theory not yet computed. The first bad
field is named by its path (``runs/KEY/final_loss``). Version 2 (the unsealed files before
version 3) is read only by :func:`~fvlib.experiments.storage.seal_result`; the fields are the same.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, dataclass, field, fields

from ..training import ADDED_FIELDS, TrainConfig
from .rules import PREFIX_RULE, THEORY_TOLERANCE_RULE, TOLERANCE_RULE, convergence_text

__all__ = ["FORMAT", "HISTORY_FIELDS", "THEORY_KINDS", "VERSION", "Attempt", "Provenance", "ResultError", "ResultFile",
           "Rules", "RunRecord", "finite", "integer", "json_values", "new_result", "theory_kind"]

FORMAT = "fvlib-experiment"
VERSION = 3
#: The shapes of a result file's ``theory``: ``depth-sweep`` (``budgets``, ``curves``,
#: ``noisefree``, ``tau2``), ``per-budget`` (one task per budget, ``M<budget>``: the strategies),
#: ``references`` (``MODEL/PRIOR``: each model's matching reference; ``tree``: the strategies).
THEORY_KINDS = ("depth-sweep", "per-budget", "references")


class ResultError(ValueError):
    """A result file that is missing, corrupt, edited outside fvlib or of another experiment definition."""


def _at(where: str, name) -> str:
    """The path of field ``name`` under ``where`` (``runs/KEY`` + ``final_loss``)."""
    return f"{where}/{name}" if where else str(name)


def _checked(cls, data, where: str) -> dict:
    """``data``'s fields for dataclass ``cls``: a mapping with every required field and no other."""
    if not isinstance(data, dict):
        raise ResultError(f"{where or 'the file'} must be a mapping, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ResultError(f"{where or 'the file'} has unknown fields {unknown}")
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [name for name in required if name not in data]
    if missing:
        raise ResultError(f"{_at(where, missing[0])} is missing")
    return data


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(value, where: str, *, null: bool = False):
    """``value`` if it is a finite number (an int or a float, not a bool; ``None`` too with
    ``null``), else :class:`ResultError` naming ``where``."""
    if (null and value is None) or (_is_number(value) and math.isfinite(value)):
        return value
    raise ResultError(f"{where} must be a finite number{' or null' if null else ''}, got {value!r}")


def integer(value, where: str, low: int = 0, *, null: bool = False):
    """``value`` if it is an int (not a bool) of at least ``low`` (``None`` too with ``null``)."""
    if (null and value is None) or (isinstance(value, int) and not isinstance(value, bool) and value >= low):
        return value
    raise ResultError(f"{where} must be an integer >= {low}{' or null' if null else ''}, got {value!r}")


def _typed(value, kind: type, where: str, *, null: bool = False):
    """``value`` if it is a ``kind`` (``str``, ``bool``, ``dict``, ``list``; ``None`` too with ``null``)."""
    if (null and value is None) or isinstance(value, kind):
        return value
    names = {str: "a string", bool: "true or false", dict: "a mapping", list: "a list"}
    got = f"a {type(value).__name__}" if isinstance(value, (dict, list)) else repr(value)[:80]
    raise ResultError(f"{where} must be {names[kind]}{' or null' if null else ''}, got {got}")


def json_values(tree, where: str):
    """``tree`` if every leaf of it is a string, a bool or a finite number (no null, NaN or
    infinity: what the stored references and analyses hold), else :class:`ResultError` naming
    the first other leaf by its path."""
    if isinstance(tree, dict):
        for key, sub in tree.items():
            json_values(sub, _at(where, key))
    elif isinstance(tree, list):
        for i, sub in enumerate(tree):
            json_values(sub, _at(where, i))
    elif not isinstance(tree, (str, bool)):
        finite(tree, where)
    return tree


#: The fields of an evaluation in a run's history (``train_loss`` is null at step 0, nothing
#: trained yet; every other is a finite number).
HISTORY_FIELDS = ("step", "lr", "train_loss", "eval_excess_loss", "eval_stderr", "eval_query_loss", "seconds")


def _history(history, where: str) -> list[dict]:
    """A run's evaluation history checked (:data:`HISTORY_FIELDS`, steps increasing)."""
    if not _typed(history, list, where):
        raise ResultError(f"{where} must hold at least one evaluation, got []")
    last = -1
    for i, entry in enumerate(history):
        at = _at(where, i)
        if set(_typed(entry, dict, at)) != set(HISTORY_FIELDS):
            raise ResultError(f"{at} must have the fields {list(HISTORY_FIELDS)}, got {sorted(entry)}")
        if integer(entry["step"], _at(at, "step")) <= last:
            raise ResultError(f"{_at(at, 'step')} must be above the step before ({last}), got {entry['step']}")
        last = entry["step"]
        for name in HISTORY_FIELDS[1:]:
            finite(entry[name], _at(at, name), null=name == "train_loss")
    return history


@dataclass
class Attempt:
    """One training of a run: its steps, final evaluation loss and whether it converged.

    ``drop``, ``drop_stderr``: under the paired-doubling rule
    (:func:`~fvlib.experiments.rules.paired_drop`), what this attempt's doubling bought: the paired
    drop of the loss from the previous attempt's final model to this one's and its standard error
    (both null for a run's first attempt, whose ``converged`` is false: convergence at ``S``
    needs ``L(2S)``). ``paired``: the attempt was judged by that rule, and its dict carries the
    two fields; an attempt of the last-fifth rule (the files stored before) has neither field, so
    that it reads and writes the same bytes (and keeps its seal)."""

    steps: int
    final_loss: float
    converged: bool
    drop: float | None = None
    drop_stderr: float | None = None
    paired: bool = False

    @classmethod
    def from_dict(cls, data: dict, where: str = "attempt") -> Attempt:
        _checked(cls, data, where)
        if "paired" in data:
            raise ResultError(f"{where} has unknown fields ['paired']")
        paired = "drop" in data or "drop_stderr" in data
        if paired and not ("drop" in data and "drop_stderr" in data):
            raise ResultError(f"{_at(where, 'drop_stderr' if 'drop' in data else 'drop')} is missing "
                              f"(an attempt has both drop and drop_stderr, or neither)")
        drop = finite(data.get("drop"), _at(where, "drop"), null=True)
        drop_stderr = finite(data.get("drop_stderr"), _at(where, "drop_stderr"), null=True)
        if (drop is None) != (drop_stderr is None):
            raise ResultError(f"{where}: drop and drop_stderr must be both null or both numbers, got "
                              f"{drop!r} and {drop_stderr!r}")
        if drop_stderr is not None and drop_stderr < 0:
            raise ResultError(f"{_at(where, 'drop_stderr')} must be >= 0, got {drop_stderr!r}")
        return cls(steps=integer(data["steps"], _at(where, "steps"), 1),
                   final_loss=finite(data["final_loss"], _at(where, "final_loss")),
                   converged=_typed(data["converged"], bool, _at(where, "converged")),
                   drop=drop, drop_stderr=drop_stderr, paired=paired)

    def to_dict(self) -> dict:
        out = {"steps": self.steps, "final_loss": self.final_loss, "converged": self.converged}
        if self.paired:
            out.update(drop=self.drop, drop_stderr=self.drop_stderr)
        return out


#: The type of each field of a :class:`Provenance`: ``str``, ``bool``, ``int`` or ``float`` (a
#: finite number); the fields with a default may also be null.
_PROVENANCE_TYPES = {"fvlib": str, "commit": str, "fvlib_modified": bool, "torch": str, "python": str,
                     "device": str, "device_name": str, "threads": int, "wall_seconds": float,
                     "cpu_seconds": float, "date": str, "item": str, "runs_in_item": int,
                     "resumed_seconds": float}


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
        nullable = {"commit", "fvlib_modified", "item", "runs_in_item", "resumed_seconds"}
        for name, kind in _PROVENANCE_TYPES.items():
            if name not in data:
                continue
            at, null = _at(where, name), name in nullable
            if kind is float:
                finite(data[name], at, null=null)
            elif kind is int:
                integer(data[name], at, null=null)
            else:
                _typed(data[name], kind, at, null=null)
        earlier = _typed(data.get("earlier", []), list, _at(where, "earlier"))
        data["earlier"] = [cls.from_dict(p, _at(where, f"earlier/{i}")) for i, p in enumerate(earlier)]
        return cls(**data)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["earlier"] = [p.to_dict() for p in self.earlier]
        return out


def _stored_config(stored: dict) -> dict:
    """A stored run's config read through :class:`~fvlib.training.TrainConfig` (checked, ``inputs``
    resolved), with every field but those of :data:`~fvlib.training.config.ADDED_FIELDS` that it
    lacks at the value that changes nothing: they stay absent, so that reading and writing a stored
    file keeps its bytes (and its seal) when a field is added later."""
    config = TrainConfig.from_dict(stored).to_dict()
    return {k: v for k, v in config.items() if k in stored or k not in ADDED_FIELDS or v != ADDED_FIELDS[k]}


@dataclass
class RunRecord:
    """One stored run (:mod:`fvlib.experiments.runner`): labels, complete config (but for the fields
    added after it was stored, :data:`~fvlib.training.config.ADDED_FIELDS`, which it reads at the value
    that changes nothing), final numbers,
    attempts, evaluation history (:data:`HISTORY_FIELDS` per evaluation), analyses, provenance.
    ``RunRecord.from_dict`` checks every field's type (a finite number where a number is due), and that
    the final loss is the last evaluation's and the last attempt's."""

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
        for name in ("key", "variant", "prior"):
            _typed(data[name], str, _at(where, name))
        for name, low in (("budget", 1), ("seed", 0), ("steps", 1)):
            integer(data[name], _at(where, name), low)
        for name in ("final_loss", "final_stderr", "final_query_loss"):
            finite(data[name], _at(where, name))
        _typed(data["converged"], bool, _at(where, "converged"))
        try:
            data["config"] = _stored_config(_typed(data["config"], dict, _at(where, "config")))
        except (TypeError, ValueError) as err:
            raise ResultError(f"{_at(where, 'config')}: {err}") from None
        attempts = _typed(data["attempts"], list, _at(where, "attempts")) or [None]
        data["attempts"] = [Attempt.from_dict(a, _at(where, f"attempts/{i}")) for i, a in enumerate(attempts)]
        data["history"] = _history(data["history"], _at(where, "history"))
        data["provenance"] = Provenance.from_dict(data["provenance"], _at(where, "provenance"))
        for name in ("greedy_paired", "gap"):
            if _typed(data.get(name), dict, _at(where, name), null=True) is not None:
                json_values(data[name], _at(where, name))
        last = data["history"][-1]
        if (last["step"], last["eval_excess_loss"]) != (data["steps"], data["final_loss"]) \
                or data["attempts"][-1].final_loss != data["final_loss"]:
            raise ResultError(f"{_at(where, 'final_loss')} ({data['final_loss']!r} at step {data['steps']}) must be "
                              f"the last evaluation's ({last['eval_excess_loss']!r} at step {last['step']}) and "
                              f"the last attempt's ({data['attempts'][-1].final_loss!r})")
        return cls(**data)

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["attempts"] = [a.to_dict() for a in self.attempts]
        out["provenance"] = self.provenance.to_dict()
        return out


@dataclass
class Rules:
    """The rules a result file was written under, in words (:mod:`fvlib.experiments.rules`);
    null: a file written before the rule was stated."""

    convergence: str | None = None
    tolerance: str | None = None
    prefix: str | None = None
    theory_tolerance: str | None = None

    @classmethod
    def from_dict(cls, data: dict, where: str = "rules") -> Rules:
        for name, value in _checked(cls, data, where).items():
            _typed(value, str, _at(where, name), null=True)
        return cls(**data)

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
    """A stored experiment's result file (module docs); :meth:`from_dict` reads version 3 (sealed)."""

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
    def from_dict(cls, data: dict, source: str = "result", *, unsealed: bool = False) -> ResultFile:
        """Read and check a result file's JSON (every field's type; :mod:`fvlib.experiments.seal`'s
        ``seal`` present, which :func:`~fvlib.experiments.storage.read_result` checks against the
        content). ``unsealed``: a version-2 file (before seals) is read too (its ``seal`` absent),
        for :func:`~fvlib.experiments.storage.seal_result`. Raises :class:`ResultError` naming
        ``source`` and the first bad field by its path (``runs/KEY/final_loss``)."""
        try:
            return cls._from_dict(data, source, unsealed)
        except ResultError as err:
            raise ResultError(f"{source}: {err}") from None

    @classmethod
    def _from_dict(cls, data, source: str, unsealed: bool) -> ResultFile:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ResultError(f"not a result file (format {FORMAT!r})")
        version = data.get("version")
        if version in (1, 2) and not (unsealed and version == 2):
            raise ResultError(f"a version-{version} result file, written before result files were sealed; "
                              f"restore the stored file (`git checkout {source}`) or seal it after checking it "
                              f"(`python -m fvlib experiment seal NAME`)")
        if version not in (2, VERSION):
            raise ResultError(f"unknown result file version {version!r} (this fvlib reads version {VERSION}); "
                              f"a newer fvlib wrote it")
        body = {k: v for k, v in data.items() if k not in ("format", "version", "seal")}
        if version == VERSION and "seal" not in data:
            raise ResultError("seal is missing")
        body = dict(_checked(cls, body, ""))
        for name in ("experiment", "description", "chapter"):
            _typed(body[name], str, name)
        for i, key in enumerate(_typed(body["planned_runs"], list, "planned_runs")):
            _typed(key, str, f"planned_runs/{i}")
        body["rules"] = Rules.from_dict(body["rules"])
        if body["theory_kind"] not in (None, *THEORY_KINDS):
            raise ResultError(f"theory_kind must be one of {THEORY_KINDS} or null, got {body['theory_kind']!r}")
        if _typed(body["theory"], dict, "theory", null=True) is not None:
            json_values(body["theory"], "theory")
        if body["theory_kind"] != theory_kind(body["theory"]):
            raise ResultError(f"theory_kind is {body['theory_kind']!r}, but the theory block is of kind "
                              f"{theory_kind(body['theory'])!r}")
        if body["theory_provenance"] is not None:
            body["theory_provenance"] = Provenance.from_dict(body["theory_provenance"], "theory_provenance")
        body["runs"] = {k: RunRecord.from_dict(r, f"runs/{k}") for k, r in _typed(body["runs"], dict, "runs").items()}
        for key, record in body["runs"].items():
            if record.key != key:
                raise ResultError(f"runs/{key}/key must be the run's key {key!r}, got {record.key!r}")
        return cls(**body)

    def to_dict(self) -> dict:
        """The JSON of the file, without its seal (:func:`~fvlib.experiments.seal.seal_of` adds it)."""
        return {"format": FORMAT, "version": VERSION, "experiment": self.experiment,
                "description": self.description, "chapter": self.chapter, "planned_runs": list(self.planned_runs),
                "rules": self.rules.to_dict(), "theory_kind": self.theory_kind, "theory": self.theory,
                "theory_provenance": None if self.theory_provenance is None else self.theory_provenance.to_dict(),
                "runs": {k: r.to_dict() for k, r in self.runs.items()}}


def new_result(experiment) -> ResultFile:
    """An empty result file of ``experiment`` (a :class:`~fvlib.experiments.definitions.Experiment`),
    stating today's rules."""
    return ResultFile(
        experiment=experiment.name, description=experiment.description, chapter=experiment.chapter,
        planned_runs=[r.key for r in experiment.runs],
        rules=Rules(convergence=convergence_text(experiment.convergence, experiment.max_doublings),
                    tolerance=TOLERANCE_RULE.format(rtol=experiment.final_rtol),
                    prefix=PREFIX_RULE.format(rtol=experiment.prefix_rtol),
                    theory_tolerance=THEORY_TOLERANCE_RULE),
        theory_kind=None, theory=None, theory_provenance=None, runs={})
