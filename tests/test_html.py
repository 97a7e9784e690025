"""leaderboard.html and the index over results folders, loaded in a real browser.

The pages are rendered from the committed leaderboards' ``leaderboard.json`` (and the figures
beside them) by the code under test, then loaded in headless Chromium (Debian's
``chromium-headless-shell``; ``.ci/run`` installs it) with ``--dump-dom``, which prints the
DOM after the page's script ran: sorting, filtering, the URL fragment, hover texts, script
errors and fetches are read from it; one page is driven over the DevTools protocol (clicks,
keys, typing) to check that the view and the URL follow a user's actions. Without a browser
these tests skip with one line, unless ``SELBENCH_REQUIRE_BROWSER`` is set (CI), where they
fail.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import tiny_spec
from selbench.cli import main
from selbench.execution.runner import run
from selbench.measure.metrics import METRICS
from selbench.reporting.html import PAGE, render_page
from selbench.store.results import slug

REPO = Path(__file__).resolve().parents[1]
COMMITTED = sorted(p.parent for p in (REPO / "leaderboards").glob("*/leaderboard.json"))
BROWSERS = ("chromium-headless-shell", "chrome-headless-shell", "chromium", "google-chrome")


def _browser() -> str | None:
    found = os.environ.get("SELBENCH_CHROMIUM") or next(
        (b for b in map(shutil.which, BROWSERS) if b), None)
    if found is None and Path("/usr/lib/chromium/chromium-headless-shell").is_file():
        found = "/usr/lib/chromium/chromium-headless-shell"
    return found


@pytest.fixture(scope="module")
def browser() -> str:
    found = _browser()
    if found is None:
        if os.environ.get("SELBENCH_REQUIRE_BROWSER"):
            pytest.fail("SELBENCH_REQUIRE_BROWSER is set but no headless Chromium is installed")
        pytest.skip("no headless Chromium (apt-get install chromium-headless-shell)")
    return found


def load(browser: str, page: Path, fragment: str = "", *extra: str) -> str:
    """The DOM of ``page`` (opened from file://, offline) after its script ran."""
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-default-apps", "--mute-audio", "--disable-dev-shm-usage",
             f"--user-data-dir={profile}",
             "--virtual-time-budget=5000", *extra, "--dump-dom",
             page.resolve().as_uri() + (("#" + fragment) if fragment else "")],
            capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Browser:
    """A page in headless Chromium driven over the DevTools protocol (``--remote-debugging-pipe``:
    commands on fd 3, replies on fd 4, each a JSON message ending in NUL): clicks and keys
    as a user gives them, then what the page shows."""

    def __init__(self, binary: str, url: str):
        self.profile = tempfile.TemporaryDirectory(ignore_cleanup_errors=True)
        cmd_r, self._cmd = os.pipe()
        self._reply, reply_w = os.pipe()

        def fds():
            os.dup2(cmd_r, 3)
            os.dup2(reply_w, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", "--remote-debugging-pipe", "--window-size=1280,900",
             f"--user-data-dir={self.profile.name}", url],
            preexec_fn=fds, close_fds=False, start_new_session=True, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(cmd_r)
        os.close(reply_w)
        self._buf, self._id, self.session = b"", 0, None
        target = next(t for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page")
        self.session = self.send("Target.attachToTarget", targetId=target["targetId"],
                                 flatten=True)["sessionId"]
        for _ in range(300):  # until the page's script finished (at most 30 s)
            if self.eval("document.body && document.body.getAttribute('data-ready')") == "1":
                break
            time.sleep(0.1)

    def send(self, method: str, **params):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._cmd, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self._buf:
                chunk = os.read(self._reply, 65536)
                assert chunk, "the browser closed its pipe"
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self._id:
                assert "error" not in reply, reply
                return reply["result"]

    def eval(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def key(self, name: str, code: int, text: str = "") -> None:
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", type=kind, key=name, code=name,
                      windowsVirtualKeyCode=code, **({"text": text} if text and kind == "keyDown" else {}))

    def close(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # the browser and the processes it started
        self.proc.wait()
        os.close(self._cmd)
        os.close(self._reply)
        self.profile.cleanup()


class Dom(HTMLParser):
    """What the tests read of a dumped page: <body>'s attributes, each leaderboard table's
    rows (method, hidden) and headers (key, aria-sort, hover text), every title attribute."""

    def __init__(self, text: str):
        super().__init__()
        self.body: dict[str, str | None] = {}
        self.tables: list[dict] = []
        self.titles: list[str] = []
        self.panel_rows: list[str] = []
        self._in_table = self._in_panel = False
        self._th: dict | None = None
        self._panel_th = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("title"):
            self.titles.append(a["title"])
        if tag == "body":
            self.body = a
        elif tag == "section" and a.get("id") == "method-panel":
            self._in_panel = "hidden" not in a
        elif tag == "table" and "data-experiment" in a:
            self.tables.append({"name": a["data-experiment"], "rows": [], "heads": {}})
            self._in_table = True
        elif tag == "tr" and self._in_table and "data-method" in a:
            self.tables[-1]["rows"].append(
                (a["data-method"], "hidden" in a, "selected" in (a.get("class") or "").split()))
        elif tag == "th" and self._in_table and "data-key" in a:
            self._th = {"sort": a.get("aria-sort")}
            self.tables[-1]["heads"][a["data-key"]] = self._th
        elif tag == "button" and self._th is not None:
            self._th["title"] = a.get("title")
            self._th = None
        elif tag == "th" and self._in_panel and a.get("scope") == "row":
            self._panel_th = True

    def handle_data(self, data):
        if self._panel_th:
            self.panel_rows.append(data)
            self._panel_th = False

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_table = False
        elif tag == "section":
            self._in_panel = False

    def shown(self, table: int = 0) -> list[str]:
        return [m for m, hidden, _ in self.tables[table]["rows"] if not hidden]


def _page(tmp_path: Path, folder: Path, tables: dict | None = None) -> Path:
    """``folder``'s page rendered by this code into ``tmp_path`` (its figure links pointing
    at the committed figures, as a relative link from there would not)."""
    tables = tables or json.loads((folder / "leaderboard.json").read_text())
    out = tmp_path / folder.name
    out.mkdir(parents=True, exist_ok=True)
    (out / PAGE).write_text(render_page(tables, folder), encoding="utf-8")
    return out / PAGE


def _ok(dom: Dom) -> None:
    assert dom.body.get("data-ready") == "1", dom.body
    assert "data-error" not in dom.body, dom.body["data-error"]
    assert "data-blocked" not in dom.body, dom.body["data-blocked"]
    assert dom.body.get("data-resources") == "0"  # nothing fetched (data: images aside)


def _no_network_reference(text: str) -> None:
    """No attribute, CSS url() or import that would load an http(s) resource (the SVG
    namespace names are names, not fetches), and a policy forbidding any fetch."""
    assert not re.search(r"""(?:src|href|srcset|action|poster|data)\s*=\s*\\?["']?\s*(?:https?:)?//""",
                         text, re.I)
    assert not re.search(r"""url\(\s*["']?\s*(?:https?:)?//|@import""", text, re.I)
    assert "default-src 'none'" in text and "connect-src" not in text


# --------------------------------------------------------------------- without a browser
@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_page_is_self_contained_and_reproducible(folder, tmp_path):
    text = _page(tmp_path, folder).read_text()
    assert text == render_page(json.loads((folder / "leaderboard.json").read_text()), folder)
    _no_network_reference(text)
    assert "<script src" not in text and "<link" not in text
    data = json.loads(re.search(r'<script type="application/json" id="lb-data">(.*?)</script>',
                                text, re.S).group(1))
    assert [e["name"] for e in data["experiments"]] == [
        e["name"] for e in json.loads((folder / "leaderboard.json").read_text())["experiments"]]
    for key, info in data["metrics"].items():  # one source of truth with `selbench metrics`
        assert METRICS[key].summary in info["help"]
    committed = folder / PAGE  # once the lead regenerated the leaderboards with this code
    if committed.is_file():
        assert committed.read_text() == text, f"{committed} is stale: selbench leaderboard"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A finished run (one method, one seed) with its figures and page."""
    root = tmp_path_factory.mktemp("tiny")
    spec = tiny_spec(name="pg", seeds=[0], methods=[
        {"label": "Confidence", "scheme": {"name": "recalibration"},
         "selector": {"name": "confidence"}}])
    run(spec, out_dir=root / "out", cache_dir=root / "cache", progress=False)
    return root / "out"


def test_run_writes_the_page_after_the_figures(tiny_run):
    text = (tiny_run / PAGE).read_text()
    exp = json.loads((tiny_run / "leaderboard.json").read_text())["experiments"][0]
    # the run's figures are linked where they lie: the experiment's and the method's
    assert f"plots/{exp['name']}/selective-ece.svg" in text
    assert f"plots/{exp['name']}/reliability/{slug('Confidence')}.svg" in text
    for link in re.findall(r'"(plots/[^"]+)"', text):
        assert (tiny_run / link).is_file(), link


def test_cli_html_site_links_each_folder(tiny_run, tmp_path, capsys):
    dirs = [tmp_path / "a", tmp_path / "b"]
    for d in dirs:
        shutil.copytree(tiny_run, d)
    (dirs[0] / PAGE).unlink()
    assert main(["leaderboard", *map(str, dirs), "--html", str(tmp_path / "site"), "-q"]) == 0
    index = (tmp_path / "site" / "index.html").read_text()
    assert (dirs[0] / PAGE).read_text() == (tiny_run / PAGE).read_text()
    assert '"href":"../a/leaderboard.html"' in index and '"href":"../b/leaderboard.html"' in index
    _no_network_reference(index)
    capsys.readouterr()
    assert main(["leaderboard", *map(str, dirs), "--html", str(tmp_path / "s2"),
                 "--out", str(tmp_path / "c")]) == 2
    assert "--html" in capsys.readouterr().err and not (tmp_path / "s2").exists()


def test_plot_redraws_the_page(tiny_run, tmp_path):
    shutil.copytree(tiny_run, tmp_path / "a")
    (tmp_path / "a" / PAGE).unlink()
    assert main(["plot", str(tmp_path / "a")]) == 0  # figures up to date: none redrawn
    assert (tmp_path / "a" / PAGE).read_text() == (tiny_run / PAGE).read_text()


def test_index_opens_offline(browser, tiny_run, tmp_path):
    shutil.copytree(tiny_run, tmp_path / "a")
    assert main(["leaderboard", str(tmp_path / "a"), "--html", str(tmp_path / "site"), "-q"]) == 0
    text = load(browser, tmp_path / "site" / "index.html")
    _ok(Dom(text))
    assert '<a href="../a/leaderboard.html">pg</a>' in text


# --------------------------------------------------------------------- in the browser
@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> Path:
    return _page(tmp_path_factory.mktemp("qs"), REPO / "leaderboards" / "quickstart")


def _means(folder: Path, metric: str) -> dict[str, float]:
    exp = json.loads((folder / "leaderboard.json").read_text())["experiments"][0]
    point = "auc" if exp["report"] == "auc" else f"{exp['betas'][0]:g}"
    return {r["method"]: r["metrics"][metric][point]["mean"] for r in exp["rows"]}


def test_sorting_by_the_fragment(browser, quickstart):
    asc, desc = (Dom(load(browser, quickstart, f"sort=ece1&dir={d}")) for d in ("asc", "desc"))
    for dom in (asc, desc):
        _ok(dom)
    up, down = asc.shown(), desc.shown()
    means = _means(REPO / "leaderboards" / "quickstart", "ece1")
    assert len(up) == len(means) > 2
    assert up == sorted(means, key=lambda m: means[m])  # mean ECE1, lowest first
    assert up == down[::-1]  # no tied means in this table
    assert asc.tables[0]["heads"]["ece1"]["sort"] == "ascending"
    assert desc.tables[0]["heads"]["ece1"]["sort"] == "descending"
    assert asc.tables[0]["heads"]["accuracy"]["sort"] == "none"
    # every metric header explains itself on hover, from the registry
    for key, head in asc.tables[0]["heads"].items():
        if key != "method":
            assert METRICS[key].summary in head["title"]
    # every value carries its intervals on hover
    assert sum("95% t-interval over seeds" in t for t in asc.titles) >= len(means) * 5
    assert any("bootstrap interval over evaluation examples" in t for t in asc.titles)


def test_default_direction_is_best_first(browser, quickstart):
    dom = Dom(load(browser, quickstart, "sort=accuracy"))  # higher is better: descending
    _ok(dom)
    means = _means(REPO / "leaderboards" / "quickstart", "accuracy")
    assert dom.shown()[0] == max(means, key=lambda m: means[m])
    assert dom.tables[0]["heads"]["accuracy"]["sort"] == "descending"
    assert dom.body["data-view"] == "sort=accuracy&dir=desc"  # the fragment says it all now


def test_filter_leaves_only_the_joint_methods(browser, quickstart):
    spec = json.loads((REPO / "leaderboards" / "quickstart" / "leaderboard.json").read_text())["spec"]
    joint = [m["label"] for m in spec["experiments"][0]["methods"] if m["scheme"]["name"] == "joint"]
    assert joint
    dom = Dom(load(browser, quickstart, "filter=joint"))
    _ok(dom)
    assert dom.shown() == joint
    assert len(dom.tables[0]["rows"]) == len(spec["experiments"][0]["methods"])  # others hidden
    dom = Dom(load(browser, quickstart, "scheme=sequential&filter=" + quote("S-MMCE")))
    assert dom.shown() == [m["label"] for m in spec["experiments"][0]["methods"]
                           if m["scheme"]["name"] == "sequential" and "S-MMCE" in m["label"]]


@pytest.mark.parametrize("name", [p.name for p in COMMITTED if p.name != "quickstart"])
def test_every_committed_leaderboard_opens_offline(browser, tmp_path, name):
    folder = REPO / "leaderboards" / name
    dom = Dom(load(browser, _page(tmp_path, folder), "sort=ece1&dir=desc"))
    _ok(dom)
    exps = json.loads((folder / "leaderboard.json").read_text())["experiments"]
    assert [t["name"] for t in dom.tables] == [e["name"] for e in exps]
    assert [len(t["rows"]) for t in dom.tables] == [len(e["rows"]) for e in exps]


def test_extra_keys_are_shown_and_a_method_everywhere(browser, tmp_path):
    """Keys this renderer does not know (a failed method's row, a new summary section) are
    shown as they come; ``#method=`` shows one method's row in every experiment."""
    folder = REPO / "leaderboards" / "tuned"
    tables = copy.deepcopy(json.loads((folder / "leaderboard.json").read_text()))
    exps = tables["experiments"]
    exps[0]["rows"].insert(0, {"method": "Broken", "metrics": {},
                               "failed": "RuntimeError: a method that failed"})
    exps[0]["rows"][1]["metrics"].pop("ece1")
    tables["summary"]["questions"] = [{"question": "Does joint training beat sequential?",
                                       "answer": "not shown", "p": 0.25}]
    method = exps[1]["rows"][2]["method"]
    text = load(browser, _page(tmp_path, folder, tables), "method=" + quote(method))
    dom = Dom(text)
    _ok(dom)
    assert "Does joint training beat sequential?" in text
    assert "a method that failed" in text
    assert [m for m, _, _ in dom.tables[0]["rows"]] == [r["method"] for r in exps[0]["rows"]]
    assert dom.panel_rows == [e["name"] for e in exps]
    selected = [m for t in dom.tables for m, _, sel in t["rows"] if sel]
    assert selected == [method] * len(exps)
    # tuned methods show the parameters each seed chose
    tuned = exps[0]["tuning"]["tuned"]
    assert tuned and any(t.startswith("chosen parameters by seed") for t in dom.titles)


ROWS = ("Array.from(document.querySelectorAll('table.lb[data-experiment] tbody')[0].rows)"
        ".filter(r => !r.hidden).map(r => r.dataset.method)")


def test_clicks_and_keys_change_the_view_and_the_fragment(browser, quickstart):
    """A user's clicks and keys: a header sorts (best first, then reversed) and the URL
    fragment follows; Enter on a focused header sorts; typing filters; a method's name
    shows its row in every experiment."""
    means = _means(REPO / "leaderboards" / "quickstart", "ece1")
    acc = _means(REPO / "leaderboards" / "quickstart", "accuracy")
    page = Browser(browser, quickstart.resolve().as_uri())
    try:
        assert page.eval("document.body.getAttribute('data-ready')") == "1"
        head = "document.querySelector('th[data-key=ece1] button')"
        page.eval(head + ".click()")
        assert page.eval("location.hash") == "#sort=ece1&dir=asc"
        assert page.eval(ROWS) == sorted(means, key=lambda m: means[m])
        page.eval(head + ".click()")
        assert page.eval("location.hash") == "#sort=ece1&dir=desc"
        assert page.eval(ROWS) == sorted(means, key=lambda m: -means[m])
        page.eval("document.querySelector('th[data-key=accuracy] button').focus()")
        page.key("Enter", 13, "\r")
        assert page.eval("location.hash") == "#sort=accuracy&dir=desc"
        assert page.eval(ROWS)[0] == max(acc, key=lambda m: acc[m])
        assert page.eval("document.querySelector('th[data-key=accuracy]')"
                         ".getAttribute('aria-sort')") == "descending"
        page.eval("document.getElementById('filter').focus()")
        page.send("Input.insertText", text="joint")
        assert page.eval("location.hash") == "#sort=accuracy&dir=desc&filter=joint"
        assert sorted(page.eval(ROWS)) == sorted(m for m in means if "joint" in m)
        page.eval("document.querySelector('tr[data-method=\"S-MMCE joint\"] th button').click()")
        assert page.eval("location.hash").endswith("&method=S-MMCE+joint")
        assert page.eval("document.getElementById('method-panel').hidden") is False
        assert page.eval("document.body.getAttribute('data-error')") is None
    finally:
        page.close()
