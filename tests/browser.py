"""Headless Chromium for tests, driven through the DevTools protocol.

A small test-side helper (the docs site has its own in tools/check_site.py):

    path = browser.find_chromium()          # None: skip the test
    with browser.Browser(path) as b:
        b.open("file:///tmp/page.html")
        b.evaluate("document.title")
        b.move_mouse(x, y)
        png = b.screenshot()
        assert not b.problems()             # console errors, exceptions

Needs Debian's `chromium` package and `websocket-client` (PyPI).
"""

import base64
import itertools
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--allow-file-access-from-files",
)


def find_chromium():
    """The Chromium binary (`/usr/bin/chromium` first), or None."""
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Browser:
    """One headless Chromium tab (a fresh, empty profile)."""

    def __init__(self, chromium, width=1280, height=900, timeout=30):
        import websocket  # test dependency (websocket-client)

        self.timeout = timeout
        self.port = _free_port()
        self.profile = tempfile.mkdtemp(prefix="ka_browser_")
        self.process = subprocess.Popen(
            [
                chromium,
                *FLAGS,
                f"--window-size={width},{height}",
                f"--remote-debugging-port={self.port}",
                f"--user-data-dir={self.profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.ids = itertools.count(1)
        self.events = []
        try:
            self.socket = websocket.create_connection(
                self._page_socket_url(),
                timeout=timeout,
                suppress_origin=True,
            )
            for domain in ("Page", "Runtime", "Log", "Network"):
                self.send(f"{domain}.enable")
            self.send(
                "Emulation.setDeviceMetricsOverride",
                width=width,
                height=height,
                deviceScaleFactor=1,
                mobile=False,
            )
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _page_socket_url(self):
        url = f"http://127.0.0.1:{self.port}/json/list"
        deadline = time.time() + self.timeout
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    for target in json.load(response):
                        if target.get("type") == "page":
                            return target["webSocketDebuggerUrl"]
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("Chromium's DevTools endpoint did not come up")

    def send(self, method, **params):
        """Sends a DevTools command and returns its result (keeps events)."""
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

    def wait_for(self, method):
        """Waits for (and consumes) the next event called `method`."""
        deadline = time.time() + self.timeout
        while time.time() < deadline:
            for i, event in enumerate(self.events):
                if event["method"] == method:
                    del self.events[: i + 1]
                    return event
            message = json.loads(self.socket.recv())
            if "method" in message:
                self.events.append(message)
        raise TimeoutError(method)

    def open(self, url):
        """Loads `url` and waits for its load event; clears old events."""
        self.events = []
        self.send("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression, await_promise=False):
        """The value of a JavaScript expression (JSON-serializable)."""
        result = self.send(
            "Runtime.evaluate",
            expression=expression,
            awaitPromise=await_promise,
            returnByValue=True,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description")
            raise RuntimeError(f"{expression!r}: {text or details['text']}")
        return result["result"].get("value")

    def wait_until(self, expression):
        """Polls a JavaScript expression until it is truthy."""
        deadline = time.time() + self.timeout
        while time.time() < deadline:
            if self.evaluate(expression):
                return
            time.sleep(0.02)
        raise TimeoutError(expression)

    def move_mouse(self, x, y):
        """A real mouse move (hover) to viewport coordinates."""
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    def click(self, x, y):
        for kind in ("mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                type=kind,
                x=x,
                y=y,
                button="left",
                clickCount=1,
            )

    def center_of(self, selector):
        """Viewport center `(x, y)` of the first element matching
        `selector`, scrolled into view."""
        return self.evaluate(
            f"(() => {{ const e = document.querySelector({selector!r});"
            " e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )

    def screenshot(self):
        """PNG bytes of the viewport."""
        data = self.send("Page.captureScreenshot", format="png")["data"]
        return base64.b64decode(data)

    def problems(self):
        """Console errors, uncaught exceptions, log errors and failed
        loads seen since the last `open`."""
        self.evaluate("0")  # collect events that arrived meanwhile
        found = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                text = details.get("exception", {}).get("description")
                found.append(f"exception: {text or details['text']}")
            elif method == "Runtime.consoleAPICalled" and params["type"] in (
                "error",
                "assert",
                "warning",
            ):
                args = [
                    a.get("value", a.get("description")) for a in params["args"]
                ]
                found.append(f"console.{params['type']}: {args}")
            elif method == "Log.entryAdded" and params["entry"]["level"] in (
                "error",
            ):
                entry = params["entry"]
                found.append(f"log: {entry['text']} {entry.get('url')}")
            elif method == "Network.loadingFailed" and not params.get(
                "canceled"
            ):
                found.append(f"load failed: {params['errorText']}")
        return found

    def requests(self):
        """URLs the page requested since the last `open`."""
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e["method"] == "Network.requestWillBeSent"
        ]

    def close(self):
        socket_ = getattr(self, "socket", None)
        if socket_ is not None:
            socket_.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
