// The console's own script: live-stream bookkeeping, ages that tick, errors
// shown to the person. No inline script or eval anywhere (the CSP forbids it).
(function () {
  "use strict";

  var lastSeen = null;   // the newest event id this page has seen
  var opened = false;    // whether the stream has been open before

  // The SSE extension calls this to open (and, after a fatal error, reopen)
  // the stream: a reopened one resumes after the last event seen, as the
  // browser's own reconnect does with Last-Event-ID.
  htmx.createEventSource = function (url) {
    if (lastSeen !== null) {
      url = url.replace(/([?&])after=\d+/, "$1after=" + lastSeen);
    }
    var source = new EventSource(url);
    // The browser reconnects by itself after a dropped connection (the
    // stream stays CONNECTING) and resumes with Last-Event-ID; only a stream
    // it gave up on (CLOSED) is the extension's to reopen, and an error.
    var handler = null;
    Object.defineProperty(source, "onerror", {
      configurable: true,
      get: function () { return handler; },
      set: function (fn) { handler = fn; }
    });
    source.addEventListener("error", function (event) {
      live("reconnecting", false);
      if (source.readyState === EventSource.CLOSED && handler) { handler(event); }
    });
    source.addEventListener("open", function () { document.body.dataset.qmLastSeen = lastSeen || ""; });
    return source;
  };

  function live(text, ok) {
    var badge = document.getElementById("live");
    if (!badge) { return; }
    badge.textContent = text;
    badge.classList.toggle("on", ok);
  }

  document.addEventListener("htmx:sseMessage", function (event) {
    var id = event.detail && event.detail.lastEventId;
    if (id && /^\d+$/.test(id)) { lastSeen = id; document.body.dataset.qmLastSeen = id; }
  });

  document.addEventListener("htmx:sseOpen", function () {
    live("live", true);
    // After a break, refresh whatever missed events would have refreshed.
    if (opened) { htmx.trigger(document.body, "qm:resync"); }
    opened = true;
  });

  document.addEventListener("htmx:sseError", function () {
    live("reconnecting", false);
  });

  document.addEventListener("htmx:responseError", function (event) {
    var notice = document.getElementById("notice");
    var xhr = event.detail.xhr;
    if (!notice || !xhr) { return; }
    notice.textContent = "The server answered " + xhr.status + ": " +
      (xhr.statusText || "error") + ". The page shows what it knew before.";
    notice.hidden = false;
  });

  // A fragment read anew keeps the <details id> the person had opened in it.
  var openDetails = [];
  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    openDetails = target ? Array.prototype.map.call(
      target.querySelectorAll("details[open][id]"), function (el) { return el.id; }) : [];
  });

  document.addEventListener("htmx:afterSwap", function () {
    var notice = document.getElementById("notice");
    if (notice) { notice.hidden = true; }
    openDetails.forEach(function (id) {
      var el = document.getElementById(id);
      if (el) { el.open = true; }
    });
    openDetails = [];
    tick();
  });

  // "12s" next to a time: kept current in the browser, not by asking the server.
  function age(seconds) {
    var units = [["d", 86400], ["h", 3600], ["m", 60]];
    for (var i = 0; i < units.length; i++) {
      if (seconds >= units[i][1]) { return Math.floor(seconds / units[i][1]) + units[i][0]; }
    }
    return Math.max(0, Math.floor(seconds)) + "s";
  }

  function tick() {
    var now = Date.now();
    document.querySelectorAll("time[data-age]").forEach(function (el) {
      var at = Date.parse(el.getAttribute("datetime"));
      if (!isNaN(at)) { el.textContent = age((now - at) / 1000); }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (!document.querySelector("[sse-connect]")) { live("", false); }
    tick();
    window.setInterval(tick, 1000);
  });
})();
