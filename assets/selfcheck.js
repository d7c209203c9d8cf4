/* The book's self-checks, checked in the page with no kernel (src/selfattn/book/kit/selfcheck.py
   writes their HTML: a div.selfattn-selfcheck with data-kind, data-expected and, as needed,
   data-rtol (a number), data-unit ("bytes") and data-hints (JSON [[factor, hint], ...]); a text
   box, a Check button and a verdict line with role="status").

   A classic script with no dependencies. On DOMContentLoaded it wires every self-check in the
   page: the Check button, or Enter in the text box, writes the verdict. The verdict says right or
   not yet, and what is off, never the answer: close (within 1 %: give the exact value or more
   digits), a hint the question names for factor x the answer (half the FLOPs; within the same
   1 %, so a rounded slip gets it too), for bytes a missing or a decimal unit, too high, too low,
   a dimension. Its words come from assets/messages.js, in the page's language (English, or
   Chinese in the Chinese edition: the button, the label and the placeholder too). What a reader types is read after NFKC normalization: full-width digits and
   punctuation, as a Chinese input method types them, read as their ASCII forms.

   A unit is accepted only where the question is about bytes (data-unit="bytes"): KiB, MiB, GiB,
   TiB (powers of 2), kB, MB, GB, TB (powers of 10), B or bytes. Elsewhere a unit is refused.

   window.selfattnSelfCheck is the test entry (tests/test_selfcheck.py calls it in Node without a
   DOM; tests/test_selfcheck_browser.py in the built book):
     parseNumber(text, unit)-> {ok: true, value, number, unit} or {ok: false, why}: "1,024",
                               "1_024", "1e6", "2**20", "2^20", "4 * 2**30", "(3 + 1) / 2", ...;
                               with unit "bytes" also "3 MiB", "3 MB", "3 bytes" (value in bytes,
                               number as typed, unit the unit's name); without it a unit fails
                               with why "unit"
     parseShape(text)       -> {ok: true, value: [ints]} or {ok: false}: "(2, 8, 16)", "2, 8, 16",
                               "[2, 8, 16]", "torch.Size([2, 8, 16])", "2 x 8 x 16"
     judge(spec, text)      -> {state, message}: spec is {kind, expected, rtol, unit, hints};
                               state is "right", "wrong", "unreadable" (not a number or a
                               shape, or a unit where none belongs) or "empty"
     readSpec(element)      -> the spec in a self-check's data attributes
     verdict(element, text) -> judge(readSpec(element), text)
     wireAll(root)          -> wires every self-check under root (document by default) */
(function (global) {
  "use strict";

  var DEFAULT_RTOL = 1e-6; // as selfcheck.DEFAULT_RTOL
  var CLOSE = 0.01; // as selfcheck.CLOSE: a wrong answer this near (relative) is "close"
  var BINARY = { KiB: 1024, MiB: 1048576, GiB: 1073741824, TiB: 1099511627776 };
  var DECIMAL = { kB: 1e3, MB: 1e6, GB: 1e9, TB: 1e12 };
  var AS_BINARY = { kB: "KiB", MB: "MiB", GB: "GiB", TB: "TiB" }; // the unit a reader may have meant
  var BYTE_UNIT = /^(.*?)\s*(kib|mib|gib|tib|kb|mb|gb|tb|b|bytes?)$/i;

  /* A unit as typed (any case) -> its name ("GiB", "MB", "bytes") and its size in bytes. */
  function byteUnit(typed) {
    var lower = typed.toLowerCase();
    if (lower === "b" || lower === "byte" || lower === "bytes") return { name: "bytes", scale: 1 };
    var names = Object.keys(BINARY).concat(Object.keys(DECIMAL));
    for (var i = 0; i < names.length; i++) {
      if (names[i].toLowerCase() === lower) {
        return { name: names[i], scale: BINARY[names[i]] || DECIMAL[names[i]] };
      }
    }
    return null;
  }

  function fail(why) {
    return { ok: false, why: why };
  }

  /* Numbers, operators and brackets; null for any other character. */
  function tokens(text) {
    var out = [];
    var re = /\s*(?:(\d+\.?\d*(?:e[+-]?\d+)?|\.\d+(?:e[+-]?\d+)?)|(\*\*|[-+*\/^()]))/iy;
    var at = 0;
    text = text.replace(/\s+$/, "");
    while (at < text.length) {
      re.lastIndex = at;
      var m = re.exec(text);
      if (!m) return null;
      out.push(m[1] !== undefined ? { num: parseFloat(m[1]) } : { op: m[2] === "^" ? "**" : m[2] });
      at = re.lastIndex;
    }
    return out;
  }

  /* Recursive descent, with Python's precedence: ** binds tighter than a unary minus on its left
     (-2**2 is -4) and groups to the right (2**3**2 is 2**9). */
  function evaluate(list) {
    var i = 0;
    function peek(op) {
      return i < list.length && list[i].op === op;
    }
    function sum() {
      var v = product();
      while (peek("+") || peek("-")) v = list[i++].op === "+" ? v + product() : v - product();
      return v;
    }
    function product() {
      var v = unary();
      while (peek("*") || peek("/")) v = list[i++].op === "*" ? v * unary() : v / unary();
      return v;
    }
    function unary() {
      if (peek("-")) { i++; return -unary(); }
      if (peek("+")) { i++; return unary(); }
      return power();
    }
    function power() {
      var base = atom();
      if (peek("**")) { i++; return Math.pow(base, unary()); }
      return base;
    }
    function atom() {
      if (i >= list.length) throw new Error("ends too soon");
      var t = list[i++];
      if (t.num !== undefined) return t.num;
      if (t.op === "(") {
        var v = sum();
        if (!peek(")")) throw new Error("unclosed bracket");
        i++;
        return v;
      }
      throw new Error("unexpected " + t.op);
    }
    var value = sum();
    if (i !== list.length) throw new Error("unexpected text after the number");
    return value;
  }

  /* What a reader typed, in the forms the parsers read: NFKC first, so that the full-width
     digits, brackets, commas and operators a Chinese or Japanese input method types
     ("\uff11\uff10\uff12\uff14", "\uff08\uff11\uff12\uff0c 5\uff0c 7\uff09", "2\uff0a\uff0a20") read as their ASCII forms; then the
     ideographic full stop and comma, the no-break and thin spaces, the times signs and the
     minus sign. */
  function normalize(text) {
    return String(text).normalize("NFKC")
      .replace(/\u3002/g, ".") // the ideographic full stop, as a decimal point
      .replace(/\u3001/g, ",") // the ideographic comma, between dimensions
      .replace(/[\u00a0\u2009\u202f]/g, " ") // no-break and thin spaces
      .replace(/[\u00d7\u22c5\u00b7]/g, "*") // times signs
      .replace(/\u2212/g, "-") // the minus sign
      .trim();
  }

  /* unit: "bytes" where the question is about bytes (a unit may follow the number); anything
     else, a plain number (a unit fails, with why "unit"). */
  function parseNumber(text, unit) {
    var s = normalize(text);
    var found = BYTE_UNIT.exec(s), typedUnit = null;
    if (found && found[1] !== "") {
      if (unit !== "bytes") return fail("unit");
      s = found[1];
      typedUnit = byteUnit(found[2]);
    }
    var scale = typedUnit ? typedUnit.scale : 1;
    s = s.replace(/(\d)[,_ ](?=\d{3}(?!\d))/g, "$1") // 1,024 and 1 024: groups of three digits
      .replace(/(\d)_(?=\d)/g, "$1"); // 1_024 (Python allows _ between any digits)
    if (s === "" || s.indexOf(",") >= 0 || s.indexOf("_") >= 0) return fail("not a number");
    var list = tokens(s);
    if (!list || list.length === 0) return fail("not a number");
    var number;
    try {
      number = evaluate(list);
    } catch (e) {
      return fail("not a number");
    }
    var value = number * scale;
    if (!isFinite(value)) return fail("not a finite number");
    return { ok: true, value: value, number: number, unit: typedUnit ? typedUnit.name : null };
  }

  function parseShape(text) {
    var s = String(text).normalize("NFKC").replace(/\u3001/g, ",").trim();
    var size = /^torch\.Size\(\s*(.*)\s*\)$/.exec(s);
    if (size) s = size[1].trim();
    var brackets = /^\((.*)\)$|^\[(.*)\]$/.exec(s);
    if (brackets) s = (brackets[1] !== undefined ? brackets[1] : brackets[2]).trim();
    var parts = s.indexOf(",") >= 0 ? s.split(",") : s.split(/\s*[x\u00d7]\s*|\s+/i);
    if (parts.length > 1 && parts[parts.length - 1].trim() === "") parts.pop(); // (12,)
    var dims = [];
    for (var i = 0; i < parts.length; i++) {
      var n = parseNumber(parts[i]);
      if (!n.ok || !Number.isInteger(n.value) || n.value < 0) return fail("not a shape");
      dims.push(n.value);
    }
    return dims.length ? { ok: true, value: dims } : fail("not a shape");
  }

  /* The page's words (assets/messages.js, loaded before this script). */
  function t(key, params) {
    return global.selfattnMessages.t(key, params);
  }

  var KINDS = { number: true, count: true, shape: true, bytes: true }; // as sc.read.*

  function right() {
    return { state: "right", message: t("sc.right") };
  }

  function notYet(what) {
    return { state: "wrong", message: t("sc.not_yet", { what: what }) };
  }

  function judge(spec, text) {
    if (!KINDS.hasOwnProperty(spec.kind)) throw new Error("unknown self-check kind " + spec.kind);
    if (String(text).trim() === "") return { state: "empty", message: t("sc.empty") };
    if (spec.kind === "shape") {
      var shape = parseShape(text);
      if (!shape.ok) return { state: "unreadable", message: t("sc.read.shape") };
      var want = spec.expected, got = shape.value;
      if (got.length !== want.length) {
        return notYet(t(got.length < want.length ? "sc.more_dims" : "sc.fewer_dims"));
      }
      var off = [];
      for (var i = 0; i < want.length; i++) if (got[i] !== want[i]) off.push("shape[" + i + "]");
      if (!off.length) return right();
      var which = off.length === 1 ? t("sc.off_one", { dim: off[0] }) :
        t("sc.off_many", { dims: off.slice(0, -1).join(t("sc.list_sep")), last: off[off.length - 1] });
      return notYet(which + t(off.length < want.length ? "sc.rest_right" : "sc.end"));
    }
    var bytes = spec.unit === "bytes";
    if (spec.unit !== undefined && spec.unit !== null && !bytes) {
      throw new Error("unknown self-check unit " + spec.unit);
    }
    var n = parseNumber(text, spec.unit);
    if (!n.ok) {
      return { state: "unreadable",
               message: t(n.why === "unit" ? "sc.no_unit" : "sc.read." + (bytes ? "bytes" : spec.kind)) };
    }
    var count = spec.kind === "count";
    // a count is right only when equal; a number within rtol (relative; absolute for an expected 0)
    var rtol = count ? 0 : spec.rtol === undefined || spec.rtol === null ? DEFAULT_RTOL : spec.rtol;
    function near(value, target) {
      return Math.abs(value - target) <= (rtol * Math.abs(target) || rtol);
    }
    if (near(n.value, spec.expected)) return right();
    // a hint's slip, typed exactly or rounded as "close" would be (1.37e11 for half of 2**38)
    var hints = spec.hints || [];
    for (var h = 0; h < hints.length; h++) {
      var slip = hints[h][0] * spec.expected;
      if (near(n.value, slip) || Math.abs(n.value - slip) <= CLOSE * Math.abs(slip)) {
        return notYet(hints[h][1]);
      }
    }
    if (bytes && n.unit && AS_BINARY[n.unit] && near(n.number * BINARY[AS_BINARY[n.unit]], spec.expected)) {
      return notYet(t("sc.decimal_unit", { unit: n.unit, binary: AS_BINARY[n.unit] }));
    }
    if (bytes && !n.unit) {
      for (var name in BINARY) {
        if (near(n.value * BINARY[name], spec.expected)) {
          return notYet(t("sc.size_in", { unit: name, text: String(text).trim() }));
        }
      }
    }
    var close = Math.abs(n.value - spec.expected) <= CLOSE * Math.abs(spec.expected);
    if (count) {
      var whole = Number.isInteger(n.value);
      if (close) { // a rounded answer, "2.75e11": not a direction, as if it were far off
        return notYet(t("sc.close_count", { why: t(whole ? "sc.not_exact" : "sc.is_whole"),
                                            then: t(bytes ? "sc.exact_bytes" : "sc.exact_count") }));
      }
      // "4.2 GiB" is a whole number of bytes in the wrong place, not a fraction of a byte
      if (!whole && (!n.unit || n.unit === "bytes")) return notYet(t("sc.whole"));
    } else if (close) {
      return notYet(t("sc.more_digits"));
    }
    return notYet(t(n.value > spec.expected ? "sc.too_high" : "sc.too_low"));
  }

  function readSpec(element) {
    var kind = element.getAttribute("data-kind");
    var rtol = element.getAttribute("data-rtol");
    var unit = element.getAttribute("data-unit");
    var hints = element.getAttribute("data-hints");
    return {
      kind: kind,
      expected: JSON.parse(element.getAttribute("data-expected")),
      rtol: rtol === null ? undefined : parseFloat(rtol),
      unit: unit === null ? undefined : unit,
      hints: hints === null ? [] : JSON.parse(hints),
    };
  }

  function verdict(element, text) {
    return judge(readSpec(element), text);
  }

  function wire(element) {
    if (element.getAttribute("data-ready") === "true") return;
    var input = element.querySelector("input");
    var button = element.querySelector("button");
    var out = element.querySelector('[role="status"]');
    var spec = readSpec(element);
    // the widget's own words, which the book's Python wrote in English, in the page's language
    var label = element.querySelector(".selfattn-selfcheck-label");
    if (label) label.textContent = t("sc.your_answer");
    button.textContent = t("sc.check");
    input.setAttribute("placeholder", t("sc.placeholder." + (spec.unit === "bytes" ? "bytes" : spec.kind)));
    function check() {
      var v = judge(spec, input.value);
      out.textContent = v.message;
      out.setAttribute("data-state", v.state);
      element.setAttribute("data-state", v.state);
      input.setAttribute("aria-invalid", v.state === "right" || v.state === "empty" ? "false" : "true");
    }
    function clear() {
      out.textContent = "";
      out.removeAttribute("data-state");
      element.removeAttribute("data-state");
      input.removeAttribute("aria-invalid");
    }
    button.addEventListener("click", check);
    input.addEventListener("keydown", function (event) {
      if (event.key === "Enter") {
        event.preventDefault();
        check();
      }
    });
    input.addEventListener("input", clear);
    button.disabled = false;
    element.setAttribute("data-ready", "true");
  }

  function wireAll(root) {
    var found = (root || document).querySelectorAll(".selfattn-selfcheck");
    for (var i = 0; i < found.length; i++) wire(found[i]);
    return found.length;
  }

  global.selfattnSelfCheck = {
    parseNumber: parseNumber,
    parseShape: parseShape,
    judge: judge,
    readSpec: readSpec,
    verdict: verdict,
    wireAll: wireAll,
  };

  if (typeof document !== "undefined") {
    if (document.readyState === "loading") {
      document.addEventListener("DOMContentLoaded", function () { wireAll(document); });
    } else {
      wireAll(document);
    }
  }
})(typeof window !== "undefined" ? window : globalThis);
