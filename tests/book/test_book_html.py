"""The rendered book, opened as a reader would: headless Chromium over a local HTTP server.

For every page listed in ``_toc.yml`` this checks that the page loads, raises no JavaScript
error, logs no console error, requests nothing that fails, renders all its math with the
MathJax copy served from ``_static/`` (no raw ``$$`` left, no MathJax error), loads every
image, and (for notebook chapters) offers a Colab launch link.

Needs ``_build/html`` (``make book``) and a Chromium at ``/usr/bin/chromium`` (Debian package
``chromium``; ``.ci/run`` installs it). Without them the test is skipped, except when the
environment variable ``CI`` is set: then it fails, so CI can never pass without running it.
Screenshots of every page go to ``_build/screenshots/``.
"""

from __future__ import annotations

import functools
import html
import http.server
import json
import os
import re
import shutil
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
TOC = ROOT / "_toc.yml"
SCREENSHOTS = ROOT / "_build" / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")

# External resources a page may ask for and that are allowed to fail here (no network).
# Everything else outside 127.0.0.1 is an error. Keep this list short and explained.
# (No widget JavaScript: _config.yml renders each explorer's HTML view instead, drawn by the
# book's own _static/fvlib-live.js.)
ALLOWED_EXTERNAL = (
    # Web fonts and analytics that themes may add; the page renders without them.
    "https://fonts.googleapis.com/",
    "https://fonts.gstatic.com/",
    "https://www.googletagmanager.com/",
    "https://www.google-analytics.com/",
)

pytestmark = pytest.mark.browser


def _unavailable(reason: str):
    """Fail in CI, skip elsewhere."""
    if IN_CI:
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)")
    pytest.skip(reason)


def _toc_files(toc_path: Path = TOC) -> list[str]:
    """Every document of the table of contents (root first), as paths without suffix."""
    toc = yaml.safe_load(toc_path.read_text())
    files = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            if "glob" in node:
                raise AssertionError("glob entries in _toc.yml are not supported by this test")
            for key in ("parts", "chapters", "sections", "subtrees", "entries"):
                walk(node.get(key))
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    return [re.sub(r"\.(md|ipynb)$", "", f) for f in files]


PAGES = _toc_files()


def _is_notebook(doc: str) -> bool:
    return (ROOT / f"{doc}.ipynb").exists()


def _allowed_external(url: str) -> bool:
    return url.startswith(ALLOWED_EXTERNAL)


def _is_local(url: str) -> bool:
    parsed = urlparse(url)
    return parsed.scheme in ("data", "blob", "about") or parsed.hostname in ("127.0.0.1", "localhost")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - signature of the base class
        pass


@pytest.fixture(scope="module")
def server():
    if not (HTML / "index.html").exists():
        _unavailable(f"{HTML} has no index.html: run `make book` first")
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists() and shutil.which(CHROMIUM) is None:
        _unavailable(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # pragma: no cover - playwright is pinned in requirements.txt
        _unavailable(f"playwright is not installed: {exc}")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


# JavaScript run in the page after load.
_WAIT_FOR_IMAGES = """
async () => {
  const imgs = Array.from(document.images);
  imgs.forEach(img => { img.loading = "eager"; });
  await Promise.all(imgs.map(img => img.complete ? null :
      new Promise(resolve => { img.addEventListener("load", resolve); img.addEventListener("error", resolve); })));
  return imgs.map(img => ({src: img.currentSrc || img.src, ok: img.complete && img.naturalWidth > 0}));
}
"""

_WAIT_FOR_MATHJAX = """
async () => {
  const deadline = Date.now() + 30000;
  while (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) {
    if (Date.now() > deadline) return false;
    await new Promise(r => setTimeout(r, 100));
  }
  await MathJax.startup.promise;
  if (MathJax.typesetPromise) await MathJax.typesetPromise();
  return true;
}
"""

_MATH_REPORT = """
() => {
  const article = document.querySelector("main") || document.body;
  const mathEls = Array.from(article.querySelectorAll(".math"));
  const unrendered = mathEls.filter(el => !el.querySelector("mjx-container"))
                            .map(el => el.textContent.trim().slice(0, 80));
  // Visible prose only: skip code, scripts and MathJax's own output.
  const skip = "pre, code, script, style, mjx-container, .highlight, textarea";
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  const texts = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    if (n.parentElement && !n.parentElement.closest(skip)) texts.push(n.nodeValue);
  }
  return {
    nMath: mathEls.length,
    nContainers: article.querySelectorAll("mjx-container").length,
    nErrors: document.querySelectorAll("mjx-merror").length,
    errorTexts: Array.from(document.querySelectorAll("mjx-merror")).map(e => e.getAttribute("data-mjx-error") || e.textContent).slice(0, 5),
    unrendered: unrendered.slice(0, 5),
    text: texts.join(" "),
    h1: (document.querySelector("h1") || {}).textContent || "",
  };
}
"""


# Code cells (their input; lines of at most 90 characters) that are wider than their box at the
# page's width: they would need a horizontal scroll bar.
_CODE_OVERFLOW = """
() => Array.from(document.querySelectorAll("main div.cell_input pre"))
  .filter(pre => pre.scrollWidth > pre.clientWidth + 1)
  .map(pre => `${pre.scrollWidth}px > ${pre.clientWidth}px: ${pre.textContent.trim().slice(0, 60)}`)
"""


@pytest.mark.parametrize("doc", PAGES)
def test_page_renders(doc, server, browser):
    html_file = HTML / f"{doc}.html"
    assert html_file.exists(), f"{doc} is in _toc.yml but {html_file} was not built"

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    problems: list[str] = []
    external: list[str] = []

    def route(r):
        url = r.request.url
        if _is_local(url):
            r.continue_()
        else:
            external.append(url)
            r.abort()

    page.route("**/*", route)
    page.on("pageerror", lambda exc, problems=problems: problems.append(f"JavaScript error: {exc}"))

    def on_console(msg):
        if msg.type != "error":
            return
        where = (msg.location or {}).get("url", "")
        if where and _allowed_external(where):
            return
        problems.append(f"console error: {msg.text} ({where})")

    page.on("console", on_console)

    def on_failed(req):
        if _is_local(req.url):
            problems.append(f"request failed: {req.url} ({req.failure})")

    page.on("requestfailed", on_failed)

    def on_response(resp):
        if _is_local(resp.url) and resp.status >= 400:
            problems.append(f"HTTP {resp.status}: {resp.url}")

    page.on("response", on_response)

    try:
        response = page.goto(f"{server}/{doc}.html", wait_until="load", timeout=60_000)
        assert response is not None and response.ok, f"{doc}: HTTP {response and response.status}"

        images = page.evaluate(_WAIT_FOR_IMAGES)
        broken = [i["src"] for i in images if not i["ok"]]
        assert not broken, f"{doc}: images that did not load: {broken}"

        # A missing asset (a 404, a failed script) explains most later failures: say so first.
        assert not problems, f"{doc}:\n" + "\n".join(problems)

        has_math = page.locator("main .math").count() > 0
        if has_math:
            assert page.evaluate(_WAIT_FOR_MATHJAX), f"{doc}: MathJax did not start within 30 s"
        report = page.evaluate(_MATH_REPORT)
        code_overflow = page.evaluate(_CODE_OVERFLOW)
        page.wait_for_timeout(200)  # let late console messages arrive

        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{doc.replace('/', '__')}.png"), full_page=True)
    finally:
        context.close()

    assert report["h1"].strip(), f"{doc}: page has no title"
    if has_math:
        assert report["nContainers"] >= report["nMath"] > 0, (
            f"{doc}: {report['nMath']} math elements but {report['nContainers']} rendered; "
            f"unrendered: {report['unrendered']}"
        )
        assert not report["unrendered"], f"{doc}: math not rendered: {report['unrendered']}"
    assert report["nErrors"] == 0, f"{doc}: MathJax errors: {report['errorTexts']}"
    text = report["text"]
    assert "$$" not in text, f"{doc}: raw $$ in the visible text"
    raw_tex = re.findall(r"\\\(|\\\[|\$\\[A-Za-z]+", text)
    assert not raw_tex, f"{doc}: raw TeX in the visible text: {raw_tex[:5]}"

    unexpected = sorted({u for u in external if not _allowed_external(u)})
    assert not unexpected, f"{doc}: requests to external hosts: {unexpected}"
    assert not problems, f"{doc}:\n" + "\n".join(problems)
    # at 1280 px a 90-character code line fits the content column (_ext/book_static/book.css)
    assert not code_overflow, f"{doc}: code cells wider than the content column: {code_overflow[:3]}"


@pytest.mark.parametrize("doc", [d for d in PAGES if _is_notebook(d)])
def test_notebook_has_colab_button(doc):
    """Notebook chapters link to Colab at the notebook's path in the repository."""
    html_file = HTML / f"{doc}.html"
    if not html_file.exists():
        _unavailable(f"{html_file} is missing: run `make book` first")
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    repo = urlparse(cfg["repository"]["url"]).path.strip("/")
    branch = cfg["repository"].get("branch", "main")
    expected = f"https://colab.research.google.com/github/{repo}/blob/{branch}/{doc}.ipynb"
    assert expected in html_file.read_text(encoding="utf-8"), f"{doc}: no Colab link {expected}"


PROGRESS_TEXT = re.compile(r"[0-9]+%\|[^<]{0,40}\| *[0-9]+/[0-9]+ \[")


@pytest.mark.parametrize("doc", PAGES)
def test_page_holds_no_progress_bar_text(doc):
    """Progress bars show live in Jupyter and Colab; a static page holds none of their text
    (``make book`` sets ``TQDM_DISABLE=1``)."""
    html_file = HTML / f"{doc}.html"
    if not html_file.exists():
        _unavailable(f"{html_file} is missing: run `make book` first")
    found = PROGRESS_TEXT.findall(html_file.read_text(encoding="utf-8"))
    assert not found, f"{doc}: progress-bar text in the page: {found[:3]}"


EXPLORER_CALL = re.compile(r"\b(prior|strategy|training|patching|dp_policy|layer_split)_explorer\(")


def _displayed_explorers(doc: str) -> int:
    """Code cells of a notebook that display an explorer (hidden cells excluded)."""
    notebook = json.loads((ROOT / f"{doc}.ipynb").read_text(encoding="utf-8"))
    count = 0
    for cell in notebook["cells"]:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        hidden = "remove-cell" in cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "code" and not hidden and EXPLORER_CALL.search(source):
            count += 1
    return count


@pytest.mark.parametrize("doc", [d for d in PAGES if _is_notebook(d)])
def test_explorers_are_static_figures_with_a_note(doc):
    """Every explorer a chapter displays appears in the HTML as its rendered figure plus the note
    that it is live in Jupyter or Colab (what a reader without JavaScript sees), and with its
    grid of states for the page's own live drawing; no page carries a widget view."""
    html_file = HTML / f"{doc}.html"
    if not html_file.exists():
        _unavailable(f"{html_file} is missing: run `make book` first")
    from fvlib.explorers.live import embedded_specs
    from fvlib.explorers.base import LIVE_NOTE

    page = html_file.read_text(encoding="utf-8")
    assert "application/vnd.jupyter.widget-view+json" not in page, f"{doc}: a live widget view in static HTML"
    assert "application/vnd.jupyter.widget-state+json" not in page, f"{doc}: unused widget state embedded"
    blocks = re.findall(r'<div class="fvlib-explorer-static">(.*?)</div>', page, flags=re.S)
    assert len(blocks) == _displayed_explorers(doc), f"{doc}: {len(blocks)} explorer figures rendered"
    for block in blocks:
        assert re.search(r'<img src="data:image/png;base64,[A-Za-z0-9+/=]{1000,}"', block), f"{doc}: no figure"
        assert html.escape(LIVE_NOTE) in block, f"{doc}: explorer without the live note"
    assert len(embedded_specs(page)) == len(blocks), f"{doc}: an explorer without its live grid"


def test_the_book_shows_all_four_explorers():
    docs = [d for d in PAGES if _is_notebook(d)]
    assert sum(_displayed_explorers(d) for d in docs) >= 4


def test_toc_lists_pages():
    """The toc parser finds the root and at least one chapter (guards against an empty run)."""
    assert PAGES and PAGES[0] == yaml.safe_load(TOC.read_text())["root"]
    assert len(PAGES) >= 2
    for doc in PAGES:
        assert (ROOT / f"{doc}.md").exists() or (ROOT / f"{doc}.ipynb").exists(), doc


# ---------------------------------------------------------------------------------------
# The live explorers: every control moves the drawing to the recorded state
# ---------------------------------------------------------------------------------------
EXPLORER_SHOTS = SCREENSHOTS / "explorers"

# What a drawing shows of a state, read back from the SVG: {series: (state path, view slice)}.
_READ_SERIES = """
(root) => Object.fromEntries(Array.from(root.querySelectorAll("[data-series]")).map(
    e => [e.getAttribute("data-series"), e.getAttribute("data-values")]))
"""


def _numbers(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v != ""]


def _expected_series(data: dict, key: str, view: dict) -> dict[str, list[float]]:
    """The numbers each explorer's drawing must show for state ``key`` at ``view``."""
    state, shared = data["states"][key], data["shared"]
    kind = data["kind"]
    if kind == "prior":
        return {"theta": state["theta"], "twin_theta": state["twin_theta"],
                "path": [n for n, v in enumerate(state["theta"]) if v != 0]}
    if kind == "strategy":
        m = view["budget"]
        return {name: state["mean"][name][:m] for name in shared["strategies"]}
    if kind == "training":
        upto = sum(1 for step in state["steps"] if step <= view["step"])
        return {"loss": state["loss"][:upto]}
    if kind == "patching":
        m, l = state["split_level"], state["layer"]
        out = {"target_overlap": state["target_overlap"], "donor_overlap": state["donor_overlap"],
               "cell": [m, l, shared["ratio"]["model" if "model" in shared["ratio"] else "theory"][m - 1][l - 1]]}
        out.update({f"row-{name}": ratio[m - 1] for name, ratio in shared["ratio"].items()})
        return out
    if kind == "dp_policy":
        return {"prob": state["branches"]["prob"],
                "values": [state["values"][k] for k in ("optimal", "greedy", "nonadaptive")]}
    if kind == "layer_split":
        return {name: state[name] for name in ("tree_by_layers", "tree_by_budget", "gaussian_by_budget")} | {
            "gaussian_by_layers": [state["gaussian_loss"]] * len(state["layer_axis"])}
    raise AssertionError(f"no expectation for explorer kind {kind!r}")


def _live_docs() -> list[str]:
    return [d for d in PAGES if _is_notebook(d) and _displayed_explorers(d)]


def _moves(data: dict) -> list[tuple[str, int]]:
    """(control, value index) moves: each control to its far end, then to a value between
    (or back to where it was, with two values)."""
    moves = []
    for c in data["controls"]:
        n = len(c["values"])
        if n < 2:
            continue
        far = 0 if c["default"] >= n / 2 else n - 1
        between = [i for i in range(1, n - 1) if i != c["default"]]
        moves += [(c["name"], far), (c["name"], between[len(between) // 2] if between else c["default"])]
    return moves


def _shown_value(data: dict, key: str, view: dict, name: str):
    """The value control ``name`` shows, read from the explorer's ``data-key`` (grid controls,
    joined by ``|`` in their order) or ``data-view`` (view controls)."""
    control = next(c for c in data["controls"] if c["name"] == name)
    if not control["grid"]:
        return view[name]
    position = [c["name"] for c in data["controls"] if c["grid"]].index(name)
    return control["values"][control["keys"].index(key.split("|")[position])]


@pytest.mark.parametrize("doc", _live_docs())
def test_explorers_are_live_in_the_page(doc, server, browser):
    """Headless Chromium moves every control of every explorer on the page: the drawing changes
    to the recorded state (its drawn numbers are that state's), nothing is requested outside
    the site and nothing is logged as an error. Screenshots at 1280 px and 390 px."""
    from fvlib.explorers.live import embedded_specs

    html_file = HTML / f"{doc}.html"
    if not html_file.exists():
        _unavailable(f"{html_file} is missing: run `make book` first")
    specs = embedded_specs(html_file.read_text(encoding="utf-8"))
    assert specs, f"{doc}: no live explorer data"
    EXPLORER_SHOTS.mkdir(parents=True, exist_ok=True)
    for width in (1280, 390):
        context = browser.new_context(viewport={"width": width, "height": 900})
        page = context.new_page()
        problems, external = [], []

        def route(r, external=external):
            if _is_local(r.request.url):
                r.continue_()
            else:
                external.append(r.request.url)
                r.abort()

        page.route("**/*", route)
        page.on("pageerror", lambda exc, problems=problems: problems.append(f"JavaScript error: {exc}"))
        page.on("console", lambda msg, problems=problems: problems.append(f"console {msg.type}: {msg.text}")
                if msg.type in ("error", "warning") else None)
        try:
            page.goto(f"{server}/{doc}.html", wait_until="load", timeout=60_000)
            roots = page.locator(".fvlib-explorer")
            assert roots.count() == len(specs), f"{doc}: {roots.count()} explorers, {len(specs)} grids"
            for index, data in enumerate(specs):
                root = roots.nth(index)
                root.scroll_into_view_if_needed()
                assert "fvlib-live-on" in (root.get_attribute("class") or ""), f"{doc}: explorer {index} not live"
                assert root.locator(".fvlib-explorer-static").is_hidden(), f"{doc}: the PNG is shown beside the drawing"
                safe = doc.replace("/", "__")
                # (the theme's sticky header would cover the top of a tall explorer)
                root.screenshot(path=str(EXPLORER_SHOTS / f"{safe}-{data['kind']}-{width}.png"),
                                style="header, .bd-header, .bd-header-article, .header-article, .skip-link "
                                      "{ visibility: hidden !important; }")
                if width != 1280:
                    # at phone width the drawing fits the screen: nothing wider than the viewport
                    overflow = root.evaluate("r => Math.max(...Array.from(r.querySelectorAll('svg'))"
                                             ".map(s => s.getBoundingClientRect().right))")
                    assert overflow <= width + 1, f"{doc}: a drawing {overflow} px wide at {width} px"
                    continue
                previous = root.evaluate(_READ_SERIES)
                previous_setting = (root.get_attribute("data-key"), json.loads(root.get_attribute("data-view")))
                for name, value_index in _moves(data):
                    control = root.locator(f'[data-control="{name}"]')
                    if control.evaluate("e => e.tagName") == "SELECT":
                        control.select_option(str(value_index))
                    else:
                        control.fill(str(value_index))  # a range input: fires input and change
                    key = root.get_attribute("data-key")
                    view = json.loads(root.get_attribute("data-view"))
                    controls = {c["name"]: c for c in data["controls"]}
                    moved = controls[name]
                    shown = _shown_value(data, key, view, name)
                    wanted = moved["values"][value_index]
                    if moved["at_most"] is not None:  # the page keeps it at most the other control
                        limit = _shown_value(data, key, view, moved["at_most"])
                        wanted = max([v for v in moved["values"] if v <= limit], default=moved["values"][0])
                        wanted = min(wanted, moved["values"][value_index])
                    assert shown == wanted, f"{doc}: {name} did not move"
                    drawn = root.evaluate(_READ_SERIES)
                    caption = root.locator(".fvlib-live-caption").inner_text()
                    if key not in data["states"]:
                        assert "No state was recorded" in caption, f"{doc}: {key} drawn without data"
                        continue
                    for series, expected in _expected_series(data, key, view).items():
                        assert series in drawn, f"{doc}: {data['kind']} at {key}: no {series} drawn"
                        assert _numbers(drawn[series]) == pytest.approx(expected, rel=1e-9, abs=1e-12), (
                            f"{doc}: {data['kind']} at {key} {view}: {series} drawn is not the recorded state")
                    if (key, view) != previous_setting:  # (a clamped move can leave the setting as it was)
                        assert drawn != previous, f"{doc}: moving {name} did not change the drawing"
                    previous, previous_setting = drawn, (key, view)
        finally:
            context.close()
        unexpected = sorted({u for u in external if not _allowed_external(u)})
        assert not unexpected, f"{doc}: requests to external hosts: {unexpected}"
        assert not external, f"{doc}: requests that leave the site: {sorted(set(external))}"
        assert not problems, f"{doc} at {width} px:\n" + "\n".join(problems)


INTERNAL_LINK = re.compile(r'<a\b[^>]*class="[^"]*\breference internal\b[^"]*"[^>]*>(.*?)</a>', flags=re.S)
RAW_LATEX_IN_LINK = ("\\", "$", "^")
MATHJAX_INLINE = re.compile(r"\\\(.*?\\\)", flags=re.S)


def internal_link_texts(page_html: str) -> list[str]:
    """The visible text of every internal link of a page (tags stripped).

    Math between MathJax's inline delimiters ``\\( ... \\)`` (the navigation and the page
    contents list a section title with math that way) is typeset in the page and dropped
    here; whatever LaTeX is left would show as raw text."""
    texts = []
    for inner in INTERNAL_LINK.findall(page_html):
        text = html.unescape(re.sub(r"<[^>]+>", "", inner))
        texts.append(MATHJAX_INLINE.sub("", text).strip())
    return texts


def test_internal_link_texts_are_found_and_checked():
    """The parser sees through nested spans, and a title with LaTeX is caught."""
    sample = ('<p><a class="reference internal" href="06_tree.html#ch-tree">'
              '<span class="std std-ref">Tree prior: <span class="math">\\(\\alpha^L\\)</span></span></a> and '
              '<a class="reference internal" href="05_gaussian.html"><span>Gaussian prior</span></a></p>')
    assert internal_link_texts(sample) == ["Tree prior:", "Gaussian prior"]  # typeset math dropped
    raw = sample.replace("\\(\\alpha^L\\)", "\\alpha^L")  # a {ref} that copied a math title
    texts = internal_link_texts(raw)
    assert texts[0] == "Tree prior: \\alpha^L"
    assert [t for t in texts if any(c in t for c in RAW_LATEX_IN_LINK)] == [texts[0]]


@pytest.mark.parametrize("doc", PAGES)
def test_link_texts_hold_no_raw_latex(doc):
    """Cross-references read as plain words: no backslash, dollar or caret in the text of any
    internal link (a section title with math needs an explicit plain link title)."""
    html_file = HTML / f"{doc}.html"
    if not html_file.exists():
        _unavailable(f"{html_file} is missing: run `make book` first")
    texts = internal_link_texts(html_file.read_text(encoding="utf-8"))
    bad = sorted({t for t in texts if any(c in t for c in RAW_LATEX_IN_LINK)})
    assert not bad, f"{doc}: internal links with raw LaTeX in their text: {bad[:5]}"
