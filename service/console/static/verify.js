// Checks a ledger entry against the latest signed checkpoint in the browser,
// with WebCrypto, by the algorithm of `qmctl ledger verify` (docs/ledger.md):
//   entry_hash = SHA-256(RFC 8785 form of the export line's "entry")
//   leaf = SHA-256(0x00 || those bytes), node = SHA-256(0x01 || left || right)
//   the RFC 6962 path from leaf seq-1 must reach the checkpoint's root
//   (RFC 9162 §2.1.3.2), and the checkpoint (a C2SP signed note) must carry an
//   Ed25519 signature by the verifier key `name+hex(key id)+base64(0x01||key)`,
//   key id = SHA-256(name || 0x0A || 0x01 || key)[0:4].
// Everything is read from what the page shows; only the result is written.
(function () {
  "use strict";

  var DASH = "\u2014 ";
  var utf8 = new TextEncoder();

  // RFC 8785: ECMAScript's own JSON serialisation of strings and numbers,
  // object keys sorted by UTF-16 code units (what Array.prototype.sort does).
  function jcs(value) {
    if (value === null || typeof value !== "object") { return JSON.stringify(value); }
    if (Array.isArray(value)) { return "[" + value.map(jcs).join(",") + "]"; }
    return "{" + Object.keys(value).sort().map(function (key) {
      return JSON.stringify(key) + ":" + jcs(value[key]);
    }).join(",") + "}";
  }

  function fromBase64(text) {
    var raw = atob(text.trim());
    var bytes = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) { bytes[i] = raw.charCodeAt(i); }
    return bytes;
  }

  function toHex(bytes) {
    return Array.prototype.map.call(bytes, function (b) {
      return (b < 16 ? "0" : "") + b.toString(16);
    }).join("");
  }

  function fromHex(text) {
    if (!/^([0-9a-f]{2})+$/.test(text)) { throw new Error("not hex: " + text); }
    return new Uint8Array(text.match(/../g).map(function (h) { return parseInt(h, 16); }));
  }

  function concat(parts) {
    var size = parts.reduce(function (n, p) { return n + p.length; }, 0);
    var out = new Uint8Array(size), at = 0;
    parts.forEach(function (p) { out.set(p, at); at += p.length; });
    return out;
  }

  function same(a, b) {
    return a.length === b.length && a.every(function (x, i) { return x === b[i]; });
  }

  async function sha256(bytes) {
    return new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  }

  function node(left, right) { return sha256(concat([Uint8Array.of(1), left, right])); }

  // RFC 9162 §2.1.3.2: the root the path gives from leaf `index` of `size`, or null.
  async function rootOf(leaf, index, size, path) {
    if (!(index >= 0 && index < size)) { return null; }
    var fn = index, sn = size - 1, digest = leaf;
    for (var i = 0; i < path.length; i++) {
      if (sn === 0) { return null; }
      if (fn % 2 === 1 || fn === sn) {
        digest = await node(path[i], digest);
        while (fn % 2 === 0 && fn !== 0) { fn = Math.floor(fn / 2); sn = Math.floor(sn / 2); }
      } else {
        digest = await node(digest, path[i]);
      }
      fn = Math.floor(fn / 2); sn = Math.floor(sn / 2);
    }
    return sn === 0 ? digest : null;
  }

  // A C2SP signed note: its text (through the root line), origin, size, root, signatures.
  function parseNote(note) {
    var cut = note.lastIndexOf("\n\n");
    if (cut < 0) { throw new Error("the checkpoint is not a signed note"); }
    var text = note.slice(0, cut + 1), lines = text.slice(0, -1).split("\n");
    if (lines.length < 3 || !/^(0|[1-9][0-9]*)$/.test(lines[1])) {
      throw new Error("the checkpoint has no origin, tree size and root hash");
    }
    var signatures = note.slice(cut + 2).replace(/\n$/, "").split("\n").map(function (line) {
      if (line.indexOf(DASH) !== 0) { throw new Error("a bad signature line"); }
      var rest = line.slice(DASH.length), space = rest.indexOf(" ");
      return { name: rest.slice(0, space), blob: fromBase64(rest.slice(space + 1)) };
    });
    return {
      text: text, origin: lines[0], size: Number(lines[1]),
      root: fromBase64(lines[2]), signatures: signatures,
    };
  }

  // Whether `key` (name+keyid+base64(0x01||key)) signed the note; a reason if not.
  async function signedBy(note, key) {
    var parts = key.trim().split("+");
    if (parts.length < 3) { return "no verifier key (name+id+key) to check it with"; }
    var name = parts[0], id = fromHex(parts[1]), raw = fromBase64(parts.slice(2).join("+"));
    if (raw.length !== 33 || raw[0] !== 1) { return "the verifier key is not an Ed25519 key"; }
    var expected = (await sha256(concat([utf8.encode(name + "\n"), raw]))).slice(0, 4);
    if (!same(expected, id)) { return "the verifier key's id does not match its key"; }
    var publicKey = await crypto.subtle.importKey(
      "raw", raw.slice(1), { name: "Ed25519" }, false, ["verify"]);
    for (var i = 0; i < note.signatures.length; i++) {
      var s = note.signatures[i];
      if (s.name !== name || s.blob.length !== 68 || !same(s.blob.slice(0, 4), id)) { continue; }
      var ok = await crypto.subtle.verify(
        { name: "Ed25519" }, publicKey, s.blob.slice(4), utf8.encode(note.text));
      if (ok) { return null; }
    }
    return "no valid signature by " + name + " (key id " + parts[1] + ")";
  }

  // The four checks, in order; the first that fails says why.
  async function verifyEntry(box) {
    var checks = {}, result = { ok: false, why: "" };
    function mark(check, ok, skipped) {
      checks[check] = ok;
      var item = box.querySelector('[data-check="' + check + '"]');
      item.dataset.result = skipped ? "skipped" : ok ? "ok" : "failed";
      item.querySelector(".mark").textContent = skipped ? "\u2013" : ok ? "\u2713" : "\u2717";
      return ok;
    }
    try {
      var line = JSON.parse(document.getElementById("entry-line").textContent);
      var entry = line.entry, bytes = utf8.encode(jcs(entry));
      // The entry asked for is the one in the address bar, not one the page names.
      var asked = Number((/\/entries\/(\d+)$/.exec(location.pathname) || [])[1]);
      if (asked !== entry.seq) {
        throw new Error("the entry served is entry " + entry.seq + ", not " + asked);
      }
      if (!mark("hash", toHex(await sha256(bytes)) === line.entry_hash)) {
        throw new Error("the entry's hash does not match its content");
      }
      var note = parseNote(document.getElementById("checkpoint-note").textContent);
      var path = Array.prototype.map.call(
        box.querySelectorAll("#proof-path code"), function (c) { return fromBase64(c.textContent); });
      var leaf = await sha256(concat([Uint8Array.of(0), bytes]));
      var root = await rootOf(leaf, entry.seq - 1, note.size, path);
      if (!mark("path", root !== null)) {
        throw new Error("the path does not fit a tree of " + note.size + " entries");
      }
      if (!mark("root", same(root, note.root))) {
        throw new Error("the path leads to a root that is not the checkpoint's");
      }
      var refused = await signedBy(note, document.getElementById("verifier-key").value);
      if (!mark("signature", refused === null)) { throw new Error(refused); }
      result = { ok: true, why: "entry " + entry.seq + " is in the checkpoint of " +
        note.size + " entries of " + note.origin + ", signed by the key above" };
    } catch (error) {
      ["hash", "path", "root", "signature"].forEach(function (c) {
        if (!(c in checks)) { mark(c, false, true); }  // not reached
      });
      result = { ok: false, why: error && error.message ? error.message : String(error) };
    }
    var verdict = document.getElementById("verdict");
    verdict.dataset.result = result.ok ? "verified" : "failed";
    verdict.textContent = (result.ok ? "Verified: " : "NOT verified: ") + result.why + ".";
  }

  // The checkpoints list: each note's signature against the key.
  async function verifyCheckpoints(rows) {
    var key = document.getElementById("verifier-key").value;
    for (var i = 0; i < rows.length; i++) {
      var cell = rows[i].querySelector(".signature"), refused;
      try {
        refused = await signedBy(parseNote(rows[i].querySelector(".checkpoint-note").textContent), key);
      } catch (error) {
        refused = error && error.message ? error.message : String(error);
      }
      cell.dataset.result = refused === null ? "verified" : "failed";
      cell.textContent = refused === null ? "\u2713 signed by the key" : "\u2717 " + refused;
    }
  }

  function run() {
    var box = document.getElementById("inclusion");
    var rows = document.querySelectorAll(".checkpoint-row");
    if (box) { return verifyEntry(box); }
    if (rows.length) { return verifyCheckpoints(rows); }
  }

  document.addEventListener("DOMContentLoaded", function () {
    var form = document.getElementById("verify-form");
    if (form) {
      form.addEventListener("submit", function (event) { event.preventDefault(); run(); });
    }
    run();
  });
})();
