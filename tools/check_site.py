"""Checks the built documentation site in a real browser (headless Chromium).

Serves `site/` (built by `mkdocs build --strict`) on localhost, opens every
page in headless Chromium through the DevTools protocol and fails on:

- console errors, uncaught exceptions and browser log errors;
- failed resource loads (network errors, HTTP status >= 400);
- formulas that MathJax did not render (an `.arithmatex` element without
  its `mjx-container`, a MathJax error `mjx-merror`, a character drawn
  without its glyph, a web font that failed);
- images that did not load (`naturalWidth == 0`).

It also saves screenshots of a formula page and an image page.

Needs Debian's `chromium` package and `websocket-client` (PyPI):

    mkdocs build --strict && python tools/check_site.py

Exit status 0 when every page is clean; the problems are printed otherwise.
"""

import argparse
import base64
import functools
import http.server
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import websocket

# name: (page, CSS selector of the element scrolled into view)
SCREENSHOTS = {
    "formula": ("guides/recurrent/index.html", "div.arithmatex"),
    "image": ("guides/masks/index.html", "img"),
}

# Runs in the page once it has loaded: waits for MathJax's first typeset,
# then reports unrendered formulas and broken images.
PAGE_REPORT = """
(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  await document.fonts.ready;  // MathJax's web fonts, once requested
  const formulas = Array.from(document.querySelectorAll(".arithmatex"));
  const unrendered = formulas
    .filter((f) => !f.querySelector("mjx-container"))
    .map((f) => f.textContent.slice(0, 80));
  // Invisible operators (function application U+2061, ...) draw nothing.
  const INVISIBLE = /mjx-c(20(6[0-4]|0B))(\s|$)/;
  // Rendered, but without its glyphs (a CHTML character whose CSS rule is
  // missing draws nothing).
  const blank = formulas
    .filter((f) => Array.from(f.querySelectorAll("mjx-c")).some(
      (c) => !c.textContent && !INVISIBLE.test(c.className) &&
        ["none", "normal", '""'].includes(
          getComputedStyle(c, "::before").content)))
    .map((f) => f.textContent.slice(0, 80));
  const errors = Array.from(document.querySelectorAll("mjx-merror"))
    .map((e) => e.textContent.slice(0, 80));
  const badFonts = Array.from(document.fonts)
    .filter((f) => f.status === "error")
    .map((f) => f.family);
  const images = Array.from(document.images);
  const broken = images
    .filter((i) => !i.complete || i.naturalWidth === 0)
    .map((i) => i.src);
  return JSON.stringify({
    title: document.title,
    formulas: formulas.length,
    unrendered: unrendered,
    blank: blank,
    mathjax_errors: errors,
    font_errors: badFonts,
    images: images.length,
    broken_images: broken,
  });
})()
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(directory):
    """A localhost HTTP server of `directory` in a daemon thread."""
    handler = functools.partial(
        QuietHandler, directory=os.path.abspath(directory)
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def pages(site):
    """Every HTML page of the site, as paths relative to `site`."""
    found = []
    for root, _, files in os.walk(site):
        for name in files:
            if name.endswith(".html"):
                path = os.path.relpath(os.path.join(root, name), site)
                found.append(path.replace(os.sep, "/"))
    return sorted(found)


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("check_site: no chromium found (apt-get install chromium)")


class Browser:
    """One headless Chromium tab driven over the DevTools protocol."""

    def __init__(self, chromium):
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="check_site_")
        self.process = subprocess.Popen(
            [
                chromium,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--hide-scrollbars",
                "--window-size=1280,1000",
                f"--remote-debugging-port={self.port}",
                f"--user-data-dir={self.profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.ids = itertools.count(1)
        self.events = []
        self.socket = websocket.create_connection(
            self._page_socket_url(), timeout=60, suppress_origin=True
        )
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")

    def _page_socket_url(self):
        url = f"http://127.0.0.1:{self.port}/json/list"
        for _ in range(100):
            try:
                with urllib.request.urlopen(url) as response:
                    targets = json.load(response)
                for target in targets:
                    if target.get("type") == "page":
                        return target["webSocketDebuggerUrl"]
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("Chromium's DevTools endpoint did not come up")

    def send(self, method, **params):
        """Sends a command and returns its result; keeps the events."""
        message_id = next(self.ids)
        self.socket.send(
            json.dumps({"id": message_id, "method": method, "params": params})
        )
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == message_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def wait_for(self, method, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for i, event in enumerate(self.events):
                if event["method"] == method:
                    del self.events[: i + 1]
                    return event
            self.events.append(json.loads(self.socket.recv()))
        raise TimeoutError(method)

    def open(self, url):
        """Loads `url`; returns the problems seen and the page's report."""
        self.events = []
        self.send("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        result = self.send(
            "Runtime.evaluate",
            expression=PAGE_REPORT,
            awaitPromise=True,
            returnByValue=True,
        )
        report = json.loads(result["result"]["value"])
        time.sleep(0.2)
        self.send("Runtime.evaluate", expression="0")  # drain late events
        return problems_of(self.events), report

    def screenshot(self, path):
        data = self.send("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self):
        self.socket.close()
        self.process.terminate()
        self.process.wait(timeout=30)
        shutil.rmtree(self.profile, ignore_errors=True)


def problems_of(events):
    """Console errors, exceptions and failed loads among DevTools events."""
    problems = []
    for event in events:
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description")
            problems.append(f"uncaught exception: {text or details['text']}")
        elif method == "Runtime.consoleAPICalled" and params["type"] in (
            "error",
            "assert",
        ):
            args = [
                a.get("value", a.get("description")) for a in params["args"]
            ]
            problems.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            problems.append(f"log error: {entry['text']} {entry.get('url')}")
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            problems.append(f"load failed: {params['errorText']}")
        elif method == "Network.responseReceived":
            response = params["response"]
            if response["status"] >= 400:
                problems.append(f"HTTP {response['status']}: {response['url']}")
    return problems


def check(site, screenshot_dir):
    server = serve(site)
    base = f"http://127.0.0.1:{server.server_address[1]}/"
    browser = Browser(find_chromium())
    failures, totals = 0, {"pages": 0, "formulas": 0, "images": 0}
    try:
        for page in pages(site):
            problems, report = browser.open(base + page)
            if page == "404.html":  # served with status 200 here
                problems = [p for p in problems if "404" not in p]
            problems += [
                f"formula not rendered: {t!r}" for t in report["unrendered"]
            ]
            problems += [
                f"MathJax error: {t!r}" for t in report["mathjax_errors"]
            ]
            problems += [
                f"image not loaded: {s}" for s in report["broken_images"]
            ]
            problems += [f"formula drawn blank: {t!r}" for t in report["blank"]]
            problems += [f"font failed: {f}" for f in report["font_errors"]]
            totals["pages"] += 1
            totals["formulas"] += report["formulas"]
            totals["images"] += report["images"]
            status = "FAIL" if problems else "ok"
            print(
                f"{status:4} {page}: {report['formulas']} formulas, "
                f"{report['images']} images"
            )
            for problem in problems:
                print("     ", problem)
            failures += bool(problems)
        if screenshot_dir:
            os.makedirs(screenshot_dir, exist_ok=True)
            for name, (page, selector) in SCREENSHOTS.items():
                browser.open(base + page)
                browser.send(
                    "Runtime.evaluate",
                    expression=f"document.querySelector({selector!r})"
                    ".scrollIntoView({block: 'start'})",
                )
                time.sleep(0.5)
                path = os.path.join(screenshot_dir, f"{name}.png")
                browser.screenshot(path)
                print("screenshot:", path)
    finally:
        browser.close()
        server.shutdown()
    print(
        f"{totals['pages']} pages, {totals['formulas']} formulas, "
        f"{totals['images']} images; {failures} page(s) with problems"
    )
    return failures


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", default="site", help="built site directory")
    parser.add_argument(
        "--screenshots",
        default=None,
        help="directory for screenshots of a formula page and an image page",
    )
    args = parser.parse_args(argv)
    if not os.path.exists(os.path.join(args.site, "index.html")):
        sys.exit(f"check_site: no built site in {args.site!r} (mkdocs build)")
    return 1 if check(args.site, args.screenshots) else 0


if __name__ == "__main__":
    sys.exit(main())
