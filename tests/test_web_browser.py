"""`cronkeeper web` in a real browser (Debian's chromium, driven by Selenium through
chromedriver), on the seeded database of ``web_seed``: the strip's cells in order with their
tooltips and the version mark, a DST gap in the strip, next fires with DST gap and fold
marks, the instance panel's stale mark and no-leader banner, the dead-letter confirmation
flow (wrong count asked again, changed selection refused, right count done), login with a
token, read-only mode, dark mode, and not one Content-Security-Policy violation in the
browser's log. Every test saves a screenshot under its temporary directory.

One browser for the whole module (they are slow to start on a 2-core box)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import psycopg
import pytest
from web_seed import WebServer, drop, freshen, libpq, seed

from cronkeeper.web.strip import CellState

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
TOKEN = "browser-token-0123"


@pytest.fixture(scope="module")
def seeded(database_url):
    s = seed(database_url)
    yield s
    drop(database_url, s.schema)


@pytest.fixture(scope="module")
def servers(seeded, tmp_path_factory):
    logs = tmp_path_factory.mktemp("web-logs")
    started = {}
    try:
        args = (seeded.url, seeded.schema, seeded.cluster)
        started["ro"] = WebServer(*args, log=logs / "ro.log")
        started["act"] = WebServer(*args, "--allow-actions", log=logs / "act.log")
        started["tok"] = WebServer(*args, log=logs / "tok.log",
                                   env={"CRONKEEPER_WEB_TOKEN": TOKEN})
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def browser():
    for path in (CHROMIUM, CHROMEDRIVER):
        assert os.access(path, os.X_OK), f"{path} is missing: run scripts/test-deps.sh"
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not look online
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="ck-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                f"--user-data-dir={profile}", "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    driver.seen_logs = []
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def visit(browser, url: str, shot: Path | None = None):
    browser.get(url)
    browser.seen_logs.extend(browser.get_log("browser"))
    if shot is not None:
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 1000
    return browser


def submit(browser, selector: str) -> None:
    """Click a form's button and wait for the page it leads to (a click does not wait): a new
    document (its own ``performance.timeOrigin``), fully loaded. Not ``staleness_of`` on the old
    page's element: asked about a node of a document being replaced, chromedriver may answer
    "Node with given id does not belong to the document" instead of "stale", which
    ``staleness_of`` does not catch."""
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    before = browser.execute_script("return performance.timeOrigin")

    def arrived(_) -> bool:
        try:
            now = browser.execute_script(
                "return document.readyState === 'complete' ? performance.timeOrigin : null")
        except WebDriverException:  # the old document is going, the new one not there yet
            return False
        return now is not None and now != before

    by_css(browser, selector)[0].click()
    WebDriverWait(browser, 30).until(arrived)
    browser.seen_logs.extend(browser.get_log("browser"))


def by_css(browser, selector: str):
    from selenium.webdriver.common.by import By

    return browser.find_elements(By.CSS_SELECTOR, selector)


def title_of(element) -> str:
    from selenium.webdriver.common.by import By

    return element.find_element(By.TAG_NAME, "title").get_attribute("textContent")


def test_schedules_strip_cells_in_order_with_tooltips(browser, servers, seeded, tmp_path):
    visit(browser, servers["act"].base + "/", tmp_path / "schedules.png")
    row = by_css(browser, 'tr[data-schedule="alpha"]')[0]
    cells = row.find_elements("css selector", "g.cell")
    assert [c.get_attribute("data-state") for c in cells] == [
        "emitted", "skipped", "missing", "dead", "skipped", "running", "missing"]
    letters = [c.find_element("css selector", "text").text for c in cells]
    assert letters == ["E", "S", "M", "D", "S", "R", "M"]  # letters and shapes, not just colour
    shapes = [c.find_element("css selector", ".box").tag_name for c in cells]
    assert shapes == ["rect", "rect", "path", "rect", "rect", "circle", "path"]
    titles = [title_of(c) for c in cells]
    assert "reason: overlap" in titles[1] and "reason: paused" in titles[4]
    assert "no outcome recorded" in titles[2]
    assert "job dead after 2 attempts" in titles[3]
    assert titles[0].startswith(seeded.m(1).strftime("%Y-%m-%d %H:%M:%S UTC"))
    marks = row.find_elements("css selector", "g.vmark")
    assert len(marks) == 1 and "schedule changed" in title_of(marks[0])
    svg = row.find_element("css selector", "svg.strip")
    assert svg.get_attribute("aria-label") == (
        "last 7 periods of alpha: 1 emitted, 2 skipped, 2 missing, 1 dead, 1 running; "
        "schedule changed 1 time")
    assert row.find_element("css selector", "td.num").text == "2"  # missing periods
    # text that holds markup is shown as text
    assert "<script>alert('x')</script>" in row.text
    # the pending state: gamma's periods are due within its hour of grace
    gamma = by_css(browser, 'tr[data-schedule="gamma"] g.cell')
    assert gamma and {c.get_attribute("data-state") for c in gamma} == {"pending"}
    # filters: by state, by owner
    visit(browser, servers["act"].base + "/?state=dead")
    assert [r.get_attribute("data-schedule") for r in by_css(browser, "tr[data-schedule]")] == ["alpha"]
    visit(browser, servers["act"].base + "/?owner=team-b")
    assert [r.get_attribute("data-schedule") for r in by_css(browser, "tr[data-schedule]")] == ["gamma"]


def test_dst_gap_in_the_strip_and_next_fire_marks(browser, servers, seeded, tmp_path):
    visit(browser, servers["ro"].base + "/schedules/dst-nightly", tmp_path / "dst-strip.png")
    cells = by_css(browser, "svg.strip g.cell")
    assert [c.get_attribute("data-state") for c in cells] == [CellState.EMITTED.value] * 4
    gap = seeded.gap_day.strftime("%Y-%m-%d")
    on_gap = [title_of(c) for c in cells if c.get_attribute("data-at").startswith(gap)]
    assert len(on_gap) == 1 and on_gap[0].startswith(f"{gap} 03:00:00 EDT (UTC-0400)")
    # next fires: a gap day fires at 03:00 EDT (the gap's end), a fold day at the first 01:30
    for name, kind, moved, words in (("march-sundays", "gap", "T03:00:00-04:00", "does not exist"),
                                     ("november-sundays", "fold", "T01:30:00-04:00",
                                      "occurs twice")):
        visit(browser, servers["ro"].base + f"/schedules/{name}", tmp_path / f"next-{kind}.png")
        rows = by_css(browser, "table.next-fires tbody tr")
        assert len(rows) == 10
        marked = [r.get_attribute("data-dst") == kind for r in rows]
        assert any(marked)
        assert marked == [moved in r.text for r in rows], [r.text for r in rows]
        assert all(words in r.text for r, m in zip(rows, marked, strict=True) if m)
        # the first fire after the transition says the offset changed
        assert any(r.get_attribute("data-dst") == "shift" for r in rows)


def test_instances_stale_mark_and_no_leader_banner(browser, servers, seeded, tmp_path):
    freshen(seeded)
    visit(browser, servers["ro"].base + "/instances", tmp_path / "instances.png")
    assert "No leader" in by_css(browser, "#no-leader")[0].text
    assert by_css(browser, "#digests")  # sched-a and sched-b disagree
    stale = by_css(browser, 'tr[data-stale="true"]')
    assert [r.get_attribute("data-instance") for r in stale] == ["sched-old"]
    assert "stale" in stale[0].text
    assert len(by_css(browser, 'tr[data-stale="false"]')) == 3


def test_queue_shows_the_four_numbers(browser, servers, tmp_path):
    visit(browser, servers["ro"].base + "/queue", tmp_path / "queue.png")
    assert by_css(browser, "#depth-dead")[0].text == "3"
    assert by_css(browser, "#depth-running")[0].text == "1"
    assert by_css(browser, "#oldest-age")[0].text == "0.0 s"  # nothing is waiting to run
    assert by_css(browser, "#failure-rate")[0].text == "-"  # no attempt ended in 5 minutes
    # the two t.other dead letters finished just now, one attempt each
    assert by_css(browser, "#attempts-per-job")[0].text == "1.0"


def dead_states(seeded) -> dict[int, str]:
    with psycopg.connect(libpq(seeded.url), options=f"-c search_path={seeded.schema}") as c:
        return dict(c.execute("SELECT id, state FROM outbox WHERE id = ANY(%s)",
                              (seeded.dead_ids,)).fetchall())


def test_replay_confirmation_flow(browser, servers, seeded, tmp_path):
    base = servers["act"].base
    visit(browser, base + "/dlq?task=t.other", tmp_path / "dlq.png")
    submit(browser, "#replay-all")
    browser.save_screenshot(str(tmp_path / "confirm.png"))
    assert "replay 2 dead letters" in by_css(browser, "#statement")[0].text
    assert "t.other (2)" in by_css(browser, "#statement")[0].text
    by_css(browser, "#count")[0].send_keys("3")  # the wrong count: asked again, nothing done
    submit(browser, "#confirm")
    assert "type their exact count, 2" in by_css(browser, "#error")[0].text
    assert set(dead_states(seeded).values()) == {"dead"}
    # the selection changes under the operator's feet: one of the two is replayed elsewhere
    other = seeded.dead_ids[1]
    with psycopg.connect(libpq(seeded.url), options=f"-c search_path={seeded.schema}") as c:
        c.execute("UPDATE outbox SET state = 'available' WHERE id = %s", (other,))
    by_css(browser, "#count")[0].send_keys("2")
    submit(browser, "#confirm")
    browser.save_screenshot(str(tmp_path / "refused.png"))
    assert "selection changed" in by_css(browser, "#error")[0].text
    assert dead_states(seeded)[seeded.dead_ids[2]] == "dead"  # nothing was done
    # the refusal shows the new selection: confirm it with its count
    assert "replay 1 dead letter" in by_css(browser, "#statement")[0].text
    by_css(browser, "#count")[0].send_keys("1")
    submit(browser, "#confirm")
    browser.save_screenshot(str(tmp_path / "done.png"))
    assert "Replayed 1 job" in by_css(browser, "#done")[0].text
    states = dead_states(seeded)
    assert states[seeded.dead_ids[2]] == "available" and states[seeded.dead_ids[0]] == "dead"


def test_login_with_token_and_read_only_mode(browser, servers, tmp_path):
    visit(browser, servers["tok"].base + "/queue", tmp_path / "login.png")
    assert by_css(browser, 'input[name="token"]') and not by_css(browser, "#depth-dead")
    by_css(browser, 'input[name="token"]')[0].send_keys("wrong")
    submit(browser, "form[action='/login'] button")
    assert "not right" in by_css(browser, "#error")[0].text
    by_css(browser, 'input[name="token"]')[0].send_keys(TOKEN)
    submit(browser, "form[action='/login'] button")
    assert browser.current_url.endswith("/queue") and by_css(browser, "#depth-dead")
    cookies = {c["name"]: c for c in browser.get_cookies()}
    assert cookies["ck_auth"]["httpOnly"] and cookies["ck_auth"]["sameSite"] == "Strict"
    # a ?token= link: the cookie is set and the token leaves the address bar
    browser.delete_all_cookies()
    visit(browser, servers["tok"].base + f"/instances?token={TOKEN}")
    assert browser.current_url == servers["tok"].base + "/instances"
    # signing out works on a read-only server too (it changes nothing but the browser's cookies)
    submit(browser, "form[action='/logout'] button")
    assert browser.current_url.endswith("/login") and by_css(browser, 'input[name="token"]')
    visit(browser, servers["tok"].base + "/instances")
    assert by_css(browser, 'input[name="token"]')  # signed out: the login form again
    # read-only: no buttons anywhere an action could be
    for path in ("/schedules/alpha", "/dlq"):
        visit(browser, servers["ro"].base + path)
        assert not by_css(browser, "form[method='post']") and not by_css(browser, "button#replay-all")
        assert "read-only" in by_css(browser, "header .mode")[0].text
    browser.save_screenshot(str(tmp_path / "read-only.png"))


def test_dark_mode_follows_the_system(browser, servers, tmp_path):
    def background() -> str:
        return browser.execute_script(
            "return getComputedStyle(document.documentElement).backgroundColor")

    try:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {
            "features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        visit(browser, servers["ro"].base + "/", tmp_path / "dark.png")
        assert background() == "rgb(17, 20, 24)"
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {
            "features": [{"name": "prefers-color-scheme", "value": "light"}]})
        visit(browser, servers["ro"].base + "/", tmp_path / "light.png")
        assert background() == "rgb(255, 255, 255)"
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})


def test_every_page_without_a_csp_violation(browser, servers, seeded, tmp_path):
    base = servers["act"].base
    key = f"alpha@{seeded.m(4).strftime('%Y-%m-%dT%H:%M:%SZ')}"
    for path in ("/", "/schedules/alpha", "/schedules/dst-nightly", "/instances", "/queue",
                 "/dlq", f"/dlq/{seeded.dead_ids[0]}", f"/explain/{key}", "/explain",
                 "/no-such-page", "/?refresh=3600"):
        visit(browser, base + path)
    visit(browser, base + f"/explain/{key}", tmp_path / "explain.png")
    assert "timeout after 30s" in browser.page_source  # every attempt is told
    logs = browser.seen_logs
    violations = [e for e in logs if "Content Security Policy" in e["message"]
                  or "Refused to" in e["message"]]
    assert violations == [], violations
    # the browser did record the pages' console output: the 404 above is in it
    assert any("404" in e["message"] for e in logs)
    # and the check can fail: an inline script slipped into a page is refused and logged
    browser.execute_script(
        "const s = document.createElement('script'); s.textContent = 'window.x = 1';"
        "document.body.appendChild(s);")
    refused = [e for e in browser.get_log("browser") if "Content Security Policy" in e["message"]]
    assert refused and browser.execute_script("return window.x === undefined")
