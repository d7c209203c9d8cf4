/* Live explorers: a sentence typed in the page, its attention computed here, in the browser.
 *
 * The book build writes each explorer's spec into the page (selfattn.book.kit.live: the trained
 * weights as float32 base64, the vocabulary, the tags), inside
 *   <div class="selfattn-live"><script type="application/json" class="selfattn-live-spec">
 * This script finds those, runs the same forward pass as PyTorch on the typed words, and draws
 * the heatmap in the book's colours (YlGnBu, 0 to 1; masked cells hatched grey), in the light
 * and the dark theme. A classic script whose only dependency is assets/messages.js (its words,
 * in the page's language), loaded before it: it works from file:// too.
 *
 * Test entry (tests/test_live.py compares it with PyTorch):
 *   await selfattnLive.explorers[name].attention(text, {model, temperature, mask})
 *   -> {tokens: [...], weights: [[[[...]]]] (layer, head, query, key), logits?: [[...]]}
 */
(function (root) {
  "use strict";
  // _static/, where the book serves this script, the runtime and the model (live.js sits in live/)
  // the page's words, in its language (assets/messages.js)
  const msg = (key, params) => root.selfattnMessages.t(key, params);
  const STATIC = typeof document !== "undefined" && document.currentScript
    ? new URL("../", document.currentScript.src).href : "";

  // ---- the forward passes, on Float32Arrays (no DOM) -------------------------------------------

  function decode(entry) {
    const bytes = Uint8Array.from(atob(entry.data), (c) => c.charCodeAt(0));
    return { shape: entry.shape, data: new Float32Array(bytes.buffer) };
  }

  // the weights of a spec (or of one of its models), decoded once
  const decoded = new WeakMap();
  function weightsOf(holder) {
    if (!decoded.has(holder))
      decoded.set(holder, Object.fromEntries(Object.entries(holder.weights).map(([k, v]) => [k, decode(v)])));
    return decoded.get(holder);
  }

  // y (T, out) = x (T, in) W^T + b, with W stored (out, in) as nn.Linear keeps it
  function linear(x, T, W, b) {
    const [out, inn] = W.shape;
    const y = new Float32Array(T * out);
    for (let t = 0; t < T; t++) {
      for (let o = 0; o < out; o++) {
        let s = b ? b.data[o] : 0;
        for (let i = 0; i < inn; i++) s += x[t * inn + i] * W.data[o * inn + i];
        y[t * out + o] = s;
      }
    }
    return y;
  }

  // a row of scores -> softmax over the keys that are not masked (null: masked)
  function softmax(row) {
    let max = -Infinity;
    for (const s of row) if (s !== null && s > max) max = s;
    const e = row.map((s) => (s === null ? 0 : Math.exp(s - max)));
    const sum = e.reduce((a, b) => a + b, 0);
    return e.map((v) => v / sum);
  }

  // chapter 2: one head over a fixed embedding, softmax(q k^T / (tau sqrt(d_k)))
  function attentionForward(spec, ids, options) {
    const w = weightsOf(spec);
    const [, dm] = w.embedding.shape;
    const dk = w.W_q.shape[1];
    const T = ids.length;
    const project = (W) => {
      const y = new Float32Array(T * dk);
      for (let t = 0; t < T; t++)
        for (let j = 0; j < dk; j++) {
          let s = 0;
          for (let i = 0; i < dm; i++) s += w.embedding.data[ids[t] * dm + i] * W.data[i * dk + j];
          y[t * dk + j] = s;
        }
      return y;
    };
    const q = project(w.W_q), k = project(w.W_k);
    const scale = 1 / ((options.temperature || 1) * Math.sqrt(dk));
    const causal = options.mask === "causal";
    const rows = [];
    for (let i = 0; i < T; i++) {
      const scores = [];
      for (let j = 0; j < T; j++) {
        if (causal && j > i) { scores.push(null); continue; }
        let s = 0;
        for (let c = 0; c < dk; c++) s += q[i * dk + c] * k[j * dk + c];
        scores.push(s * scale);
      }
      rows.push(softmax(scores));
    }
    return { weights: [[rows]], masked: causal ? (i, j) => j > i : null };
  }

  // chapters 1 and 5: selfattn.book.tagging.AttentionTagger
  function taggerForward(model, ids) {
    const c = model.config, W = weightsOf(model), T = ids.length, d = c.d;
    if (T > c.max_len) throw new Error(`at most ${c.max_len} tokens`);
    const x = new Float32Array(T * d);
    for (let t = 0; t < T; t++)
      for (let i = 0; i < d; i++) x[t * d + i] = W["embed.weight"].data[ids[t] * d + i];
    if (c.positions === "sinusoidal") { // sin on even features, cos on odd (positional.py)
      for (let t = 0; t < T; t++)
        for (let i = 0; i < d; i += 2) {
          const angle = Math.fround(t * Math.fround(Math.pow(10000, -i / d))); // float32, as torch
          x[t * d + i] += Math.fround(Math.sin(angle));
          x[t * d + i + 1] += Math.fround(Math.cos(angle));
        }
    } else if (c.positions === "learned") {
      const table = W["learned.table.weight"].data;
      for (let t = 0; t < T; t++) for (let i = 0; i < d; i++) x[t * d + i] += table[t * d + i];
    }
    const H = c.n_heads, G = c.n_kv_heads, hd = c.head_dim;
    const q = linear(x, T, W["attn.q_proj.weight"], W["attn.q_proj.bias"]); // (T, H hd)
    const k = linear(x, T, W["attn.k_proj.weight"], W["attn.k_proj.bias"]); // (T, G hd)
    const v = linear(x, T, W["attn.v_proj.weight"], W["attn.v_proj.bias"]); // (T, G hd)
    if (c.positions === "rope") { // rotate each pair (2i, 2i+1) of every head by t theta_i
      for (const [y, n] of [[q, H], [k, G]])
        for (let t = 0; t < T; t++)
          for (let h = 0; h < n; h++)
            for (let i = 0; i < hd; i += 2) {
              const angle = Math.fround(t * Math.fround(Math.pow(10000, -i / hd)));
              const cos = Math.fround(Math.cos(angle)), sin = Math.fround(Math.sin(angle));
              const at = t * n * hd + h * hd + i, x1 = y[at], x2 = y[at + 1];
              y[at] = x1 * cos - x2 * sin;
              y[at + 1] = x1 * sin + x2 * cos;
            }
    }
    const slopes = c.positions === "alibi" ? W.alibi_slopes.data : null;
    const masked = c.causal ? (i, j) => j > i : null;
    const weights = [], mixed = new Float32Array(T * H * hd);
    for (let h = 0; h < H; h++) {
      const g = Math.floor(h / (H / G)); // the key/value head this query head reads
      const rows = [];
      for (let i = 0; i < T; i++) {
        const scores = [];
        for (let j = 0; j < T; j++) {
          if (masked && masked(i, j)) { scores.push(null); continue; }
          let s = 0;
          for (let e = 0; e < hd; e++) s += q[i * H * hd + h * hd + e] * k[j * G * hd + g * hd + e];
          s /= Math.sqrt(hd);
          if (slopes) s -= slopes[h] * Math.abs(i - j);
          scores.push(s);
        }
        const p = softmax(scores);
        rows.push(p);
        for (let j = 0; j < T; j++)
          for (let e = 0; e < hd; e++) mixed[i * H * hd + h * hd + e] += p[j] * v[j * G * hd + g * hd + e];
      }
      weights.push(rows);
    }
    const a = linear(mixed, T, W["attn.out_proj.weight"], W["attn.out_proj.bias"]); // (T, d)
    for (let i = 0; i < T * d; i++) a[i] += x[i]; // the residual
    const hidden = linear(a, T, W["mlp.0.weight"], W["mlp.0.bias"]).map((z) => Math.max(z, 0));
    const logits = linear(hidden, T, W["mlp.2.weight"], W["mlp.2.bias"]);
    const C = c.n_tags, rows = [];
    for (let t = 0; t < T; t++) rows.push(Array.from(logits.slice(t * C, (t + 1) * C)));
    return { weights: [weights], logits: rows, masked };
  }

  // the task's own rule, to say where the model agrees (selfattn.book.tagging, selfattn.book.positional_encoding)
  function ruleTags(rule, words) {
    const cue = (w) => (/^c\d+$/.test(w) ? Number(w.slice(1)) : 0);
    if (rule === "latest_cue") { // every token: the latest cue at or before it
      let last = 0;
      return words.map((w) => (last = cue(w) || last) ? `c${last}` : "no cue yet");
    }
    // 'saw': the task's sentences hold one 'saw' and exactly one cue before it (decoys, if
    // any, come after), and its sense is that cue's; any other sentence is outside the task
    const saws = words.filter((w) => w === "saw").length;
    return words.map((w, t) => {
      if (w !== "saw") return null;
      const before = words.slice(0, t).filter(cue);
      return saws === 1 && before.length === 1 ? `sense ${cue(before[0])}` : "outside the task";
    });
  }

  // Punctuation (Unicode's category P) is read as a space, and the caption says it was left
  // out: "I saw a saw." is the sentence "i saw a saw" (selfattn.book.kit.live.tokenize, too).
  const PUNCTUATION = /\p{P}/gu;

  function tokenize(spec, text) {
    const dropped = [...new Set(text.match(PUNCTUATION) || [])];
    const words = text.replace(PUNCTUATION, " ").toLowerCase().split(/\s+/).filter(Boolean);
    if (!words.length) throw new InputError(msg("live.type_first"));
    if (words.length > spec.max_tokens)
      throw new InputError(msg("live.too_many_words", { n: words.length, max: spec.max_tokens }));
    const ids = [];
    for (const w of words) {
      const i = spec.words.indexOf(w);
      if (i < 0) {
        throw new InputError(msg("live.unknown_word", { word: w, vocab: vocabulary(spec) }));
      }
      ids.push(i);
    }
    return { words, ids, dropped };
  }

  // the words a spec knows, shortened to the first twelve and the last when there are many
  function vocabulary(spec) {
    const known = spec.words.filter((x) => x !== null);
    return known.length > 16 ? `${known.slice(0, 12).join(" ")} … ${known[known.length - 1]}` : known.join(" ");
  }

  // what the caption adds when punctuation was left out
  function droppedNote(dropped) {
    return dropped.length ? msg("live.dropped", { chars: dropped.map((c) => `“${c}”`).join(" ") }) : "";
  }

  class InputError extends Error {}

  function compute(spec, text, options) {
    const { words, ids, dropped } = tokenize(spec, text);
    if (spec.kind === "attention") return { tokens: words, dropped, ...attentionForward(spec, ids, options) };
    const name = options.model || Object.keys(spec.models)[0];
    const out = taggerForward(spec.models[name], ids);
    const predicted = out.logits.map((row) => spec.tags[row.indexOf(Math.max(...row))]);
    return { tokens: words, dropped, ...out, predicted, rule: ruleTags(spec.rule, words) };
  }

  // ---- drawing -------------------------------------------------------------------------------

  function drawHeatmap(canvas, rows, labels, masked, colors, title) {
    const T = labels.length, dpr = root.devicePixelRatio || 1;
    const text = getComputedStyle(canvas).color; // the theme's text colour (live.css), resolved
    // the page's own font stack, the book's Chinese font first (a token such as 木 has a glyph
    // where the system has none)
    const font = `11px ${getComputedStyle(canvas).fontFamily || "system-ui, sans-serif"}`;
    const ctx0 = canvas.getContext("2d");
    ctx0.font = font;
    const labelW = Math.ceil(Math.max(...labels.map((l) => ctx0.measureText(l).width))) + 8;
    const box = canvas.parentElement, boxStyle = getComputedStyle(box);
    const inner = (box.clientWidth || 640) - parseFloat(boxStyle.paddingLeft || 0) - parseFloat(boxStyle.paddingRight || 0);
    const avail = Math.max(200, inner - labelW - 104); // the content box, less labels and colour bar
    const cell = Math.max(3, Math.min(34, Math.floor(avail / T)));
    const every = Math.ceil(13 / cell); // label every token while they fit, else every k-th
    const left = labelW + 18, top = 26, size = cell * T;
    const width = left + size + 84, height = top + size + labelW + 22;
    canvas.width = width * dpr; canvas.height = height * dpr;
    canvas.style.width = `${width}px`; canvas.style.height = `${height}px`;
    const ctx = canvas.getContext("2d");
    ctx.scale(dpr, dpr);
    ctx.font = font;
    ctx.fillStyle = text;
    ctx.textBaseline = "middle";
    ctx.fillText(title, left, 12);
    for (let i = 0; i < T; i++)
      for (let j = 0; j < T; j++) {
        const x = left + j * cell, y = top + i * cell;
        if (masked && masked(i, j)) { // hatched grey: masked, not "weight 0"
          ctx.fillStyle = "#dddddd"; ctx.fillRect(x, y, cell, cell);
          ctx.strokeStyle = "#999999"; ctx.beginPath();
          ctx.moveTo(x, y + cell); ctx.lineTo(x + cell, y); ctx.stroke();
          continue;
        }
        const w = rows[i][j];
        ctx.fillStyle = colors[Math.min(255, Math.max(0, Math.round(w * 255)))];
        ctx.fillRect(x, y, cell, cell);
        if (T <= 12 && cell >= 28) {
          ctx.fillStyle = w > 0.5 ? "#ffffff" : "#222222";
          ctx.textAlign = "center";
          ctx.fillText(w.toFixed(2), x + cell / 2, y + cell / 2);
          ctx.textAlign = "left";
        }
      }
    ctx.fillStyle = text;
    ctx.textAlign = "right";
    labels.forEach((l, i) => { if (i % every === 0) ctx.fillText(l, left - 4, top + i * cell + cell / 2); });
    labels.forEach((l, j) => { // key labels, turned
      if (j % every) return;
      ctx.save();
      ctx.translate(left + j * cell + cell / 2, top + size + 4);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(l, 0, 0);
      ctx.restore();
    });
    ctx.textAlign = "center";
    ctx.fillText(msg("live.axis_key"), left + size / 2, top + size + labelW + 12);
    ctx.save();
    ctx.translate(10, top + size / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.fillText(msg("live.axis_query"), 0, 0);
    ctx.restore();
    const bx = left + size + 16; // the colour bar, 0 at the bottom
    for (let y = 0; y < size; y++) {
      ctx.fillStyle = colors[Math.round(255 * (1 - y / Math.max(1, size - 1)))];
      ctx.fillRect(bx, top + y, 12, 1);
    }
    ctx.fillStyle = text;
    ctx.textAlign = "left";
    ctx.fillText("1", bx + 16, top + 4);
    ctx.fillText("0", bx + 16, top + size - 4);
    ctx.fillText(msg("live.weight"), bx + 16, top + size / 2);
  }

  // ---- the explorer --------------------------------------------------------------------------

  function element(tag, props, children) {
    const e = Object.assign(document.createElement(tag), props || {});
    for (const c of children || []) e.append(c);
    return e;
  }

  function select(label, values, format) {
    const s = element("select", {}, values.map((v) => element("option", { value: String(v), textContent: format ? format(v) : String(v) })));
    return [s, element("label", {}, [label + " ", s])];
  }

  // The sentence box, its label and the message under it: the box is described by the message
  // (aria-describedby) and marked invalid while the message is an error (aria-invalid).
  function sentenceBox(name, value, describedBy) {
    const input = element("input", { type: "text", value, spellcheck: false, autocomplete: "off",
      autocapitalize: "off", className: "selfattn-live-text", id: `selfattn-live-${name}-text` });
    const message = element("p", { className: "selfattn-live-message", id: `selfattn-live-${name}-message` });
    input.setAttribute("aria-describedby", [...describedBy, message.id].join(" "));
    const label = element("label", { className: "selfattn-live-sentence", htmlFor: input.id }, [msg("live.sentence")]);
    const setMessage = (text) => {
      message.textContent = text;
      input.setAttribute("aria-invalid", text ? "true" : "false");
    };
    return { input, label, message, setMessage };
  }

  // A polite live region, out of sight, that says the result line (or the message) once the
  // reader pauses, so that a screen reader does not read out every keystroke's result.
  function announcer() {
    const region = element("p", { className: "selfattn-live-status selfattn-visually-hidden" });
    region.setAttribute("role", "status");
    region.setAttribute("aria-live", "polite");
    let timer = null;
    const say = (text) => {
      clearTimeout(timer);
      timer = setTimeout(() => { region.textContent = text; }, ANNOUNCE_AFTER_MS);
    };
    return { region, say };
  }
  const ANNOUNCE_AFTER_MS = 600;

  function mount(div) {
    const spec = JSON.parse(div.querySelector("script.selfattn-live-spec").textContent);
    if (spec.kind === "minilm") return mountMiniLM(div, spec);
    const vocab = element("p", { className: "selfattn-live-vocab", id: `selfattn-live-${spec.name}-vocab`,
      textContent: msg("live.vocab", { vocab: vocabulary(spec) }) });
    const { input, label, message, setMessage } = sentenceBox(spec.name, spec.sentences[0], [vocab.id]);
    const { region, say } = announcer();
    const controls = [label, input];
    const state = {};
    let headSelect = null;
    if (spec.kind === "attention") {
      const [t, tl] = select(msg("live.temperature"), spec.temperatures);
      t.value = String(spec.temperatures.includes(1) ? 1 : spec.temperatures[0]);
      const [m, ml] = select(msg("live.mask"), spec.masks);
      state.temperature = t; state.mask = m;
      controls.push(tl, ml);
    } else {
      const names = Object.keys(spec.models);
      if (names.length > 1) {
        const [m, ml] = select(msg("live.model"), names);
        state.model = m; controls.push(ml);
      }
      const H = spec.models[names[0]].config.n_heads;
      const [h, hl] = select(msg("live.head"), [...Array(H).keys()]);
      headSelect = h; controls.push(hl);
    }
    const examples = element("div", { className: "selfattn-live-examples" }, [msg("live.try")]);
    spec.sentences.forEach((s) => {
      const b = element("button", { type: "button", textContent: s });
      b.addEventListener("click", () => { input.value = s; redraw(); });
      examples.append(b, " ");
    });
    const canvas = element("canvas", { className: "selfattn-live-canvas" });
    canvas.setAttribute("role", "img");
    const caption = element("p", { className: "selfattn-live-caption" });
    div.querySelector(".selfattn-live-fallback")?.remove(); // the spec's script stays
    div.append(vocab, element("div", { className: "selfattn-live-controls" }, controls), examples, message,
      canvas, caption, region);

    const options = () => Object.fromEntries(Object.entries(state).map(([k, s]) => [k, k === "temperature" ? Number(s.value) : s.value]));
    // quiet: a redraw the reader did not ask for (the first one, a change of theme) is not said
    function redraw(quiet) {
      let out;
      try {
        out = compute(spec, input.value, options());
      } catch (e) {
        if (!(e instanceof InputError)) throw e;
        setMessage(e.message);
        canvas.hidden = true; caption.textContent = "";
        if (quiet !== true) say(e.message);
        return;
      }
      setMessage("");
      canvas.hidden = false;
      const head = headSelect ? Number(headSelect.value) : 0;
      const rows = out.weights[0][head];
      const o = options();
      const title = spec.kind === "attention"
        ? (o.mask === "none" ? msg("live.title_no_mask", { t: o.temperature })
          : msg("live.title_mask", { t: o.temperature, mask: o.mask }))
        : `${o.model ? o.model + ", " : ""}${msg("live.title_head", { head })}`;
      drawHeatmap(canvas, rows, out.tokens, out.masked, spec.colors, title);
      canvas.setAttribute("aria-label", msg("live.canvas", { title, tokens: out.tokens.join(" ") }));
      caption.textContent = (spec.kind === "attention" ? entropyCaption(rows, o.mask === "causal") : tagCaption(out)) +
        droppedNote(out.dropped);
      if (quiet !== true) say(caption.textContent);
    }
    function entropyCaption(rows, causal) {
      const H = rows.map((r) => -r.reduce((a, p) => a + (p > 0 ? p * Math.log(p) : 0), 0));
      const mean = H.reduce((a, b) => a + b, 0) / H.length;
      // uniform over the keys a row may see: all n, or 1..n under the causal mask
      const seen = rows.map((_, i) => Math.log(causal ? i + 1 : rows.length));
      const uniform = seen.reduce((a, b) => a + b, 0) / rows.length;
      return msg("live.entropy", { mean: mean.toFixed(2), uniform: uniform.toFixed(2) });
    }
    function tagCaption(out) {
      const pairs = out.rule.map((want, t) => [t, want]).filter(([, want]) => want !== null);
      const agree = pairs.filter(([t, want]) => out.predicted[t] === want).length;
      if (spec.rule === "cue_before_saw") {
        if (!pairs.length) return msg("live.no_saw");
        return pairs.map(([i, want]) => msg("live.saw_says", { n: i + 1, tag: out.predicted[i] }) +
          (want === "outside the task"
            ? msg("live.saw_outside")
            : msg("live.saw_rule", { tag: want }))).join(msg("live.saw_sep"));
      }
      return msg("live.latest", { agree, n: pairs.length, last: out.predicted[out.predicted.length - 1] });
    }
    input.addEventListener("input", () => redraw());
    for (const s of [...Object.values(state), headSelect]) if (s) s.addEventListener("change", () => redraw());
    new MutationObserver(() => redraw(true)).observe(document.documentElement, { attributes: true, attributeFilter: ["data-theme"] });
    redraw(true);
    api.explorers[spec.name] = {
      spec,
      // the test entry: tokens and weights (layer, head, query, key), as PyTorch would give
      attention: async (text, opts) => {
        const out = compute(spec, text, opts || {});
        return { tokens: out.tokens, weights: out.weights, logits: out.logits || null };
      },
    };
  }

  // ---- chapter 10: MiniLM through onnxruntime-web, in a worker, behind a download button ------

  function loadScript(src) {
    return new Promise((resolve, reject) => {
      const s = Object.assign(document.createElement("script"), { src });
      s.onload = resolve;
      s.onerror = () => reject(new Error(`could not load ${src}`));
      document.head.append(s);
    });
  }

  // one head's (T, T) rows out of the model's flat (layers, heads, T, T) output
  function headRows(data, T, layer, head, H) {
    const base = (layer * H + head) * T * T;
    return [...Array(T).keys()].map((i) => Array.from(data.subarray(base + i * T, base + (i + 1) * T)));
  }

  // the weights (layer, head, query, key) of one head as a small picture: one pixel a cell
  function drawThumbnail(canvas, data, T, layer, head, H, colors) {
    canvas.width = T; canvas.height = T;
    const ctx = canvas.getContext("2d"), image = ctx.createImageData(T, T);
    const base = (layer * H + head) * T * T;
    for (let i = 0; i < T * T; i++) {
      const c = colors[Math.min(255, Math.max(0, Math.round(data[base + i] * 255)))];
      image.data[4 * i] = parseInt(c.slice(1, 3), 16);
      image.data[4 * i + 1] = parseInt(c.slice(3, 5), 16);
      image.data[4 * i + 2] = parseInt(c.slice(5, 7), 16);
      image.data[4 * i + 3] = 255;
    }
    ctx.putImageData(image, 0, 0);
  }

  function mountMiniLM(div, spec) {
    const url = (path) => new URL(path, STATIC).href;
    const mb = (bytes) => (bytes / 1e6).toFixed(1);
    const total = spec.bytes.model + spec.bytes.runtime + spec.bytes.vocab;
    const intro = element("p", { className: "selfattn-live-intro" });
    const explorer = {
      spec, timings: [], ready: null, loaded: false,
      load: () => { throw new Error("live MiniLM needs the book served over http"); },
      attention: async () => { throw new Error("press the download button first"); },
    };
    api.explorers[spec.name] = explorer;
    div.querySelector(".selfattn-live-fallback")?.remove();
    if (location.protocol === "file:") {
      intro.textContent = msg("live.minilm_file");
      div.append(intro);
      return;
    }
    const button = element("button", { type: "button", className: "selfattn-live-load",
      textContent: msg("live.minilm_button", { mb: mb(total) }) });
    intro.textContent = msg("live.minilm_intro", { model: mb(spec.bytes.model),
      runtime: mb(spec.bytes.runtime), vocab: mb(spec.bytes.vocab) });
    const progress = element("p", { className: "selfattn-live-message", role: "status" });
    div.append(intro, button, progress);

    explorer.load = () => {
      if (explorer.ready) return explorer.ready;
      button.disabled = true;
      explorer.ready = (async () => {
        const [, vocab] = await Promise.all([
          loadScript(url(spec.tokenizer)),
          fetch(url(spec.vocab)).then((r) => r.text()),
        ]);
        const tokenizer = root.SelfattnWordPiece.fromVocab(vocab);
        const worker = new Worker(url(spec.worker), { type: "module" });
        const waiting = new Map();
        let nextId = 0;
        await new Promise((resolve, reject) => {
          worker.onmessage = ({ data }) => {
            if (data.type === "progress")
              progress.textContent = msg("live.minilm_progress",
                { loaded: mb(data.loaded), total: mb(data.total || spec.bytes.model) });
            else if (data.type === "ready") { progress.textContent = ""; resolve(); }
            else if (data.type === "error") reject(new Error(data.message));
            else if (data.type === "result") { waiting.get(data.id)(data); waiting.delete(data.id); }
          };
          worker.postMessage({ type: "load", ort: url(spec.ort), wasmPaths: url(spec.wasm), model: url(spec.model) });
        });
        const run = (ids) => new Promise((resolve) => {
          const id = nextId++;
          waiting.set(id, resolve);
          worker.postMessage({ type: "run", id, ids });
        });
        explorer.attention = async (text) => {
          const { ids, tokens } = tokenizer.encode(text);
          const r = await run(ids);
          const weights = [...Array(spec.layers).keys()].map((l) =>
            [...Array(spec.heads).keys()].map((h) => headRows(r.attentions, r.T, l, h, spec.heads)));
          return { tokens, ids, weights, ms: r.ms };
        };
        button.remove();
        intro.remove();
        progress.remove();
        buildViewer(tokenizer, run);
        explorer.loaded = true;
      })().catch((e) => { progress.textContent = msg("live.minilm_failed", { error: e.message }); throw e; });
      return explorer.ready;
    };
    button.addEventListener("click", () => explorer.load().catch(() => {}));

    function buildViewer(tokenizer, run) {
      const L = spec.layers, H = spec.heads;
      const { input, label, message, setMessage } = sentenceBox(spec.name, spec.sentences[0], []);
      const { region, say } = announcer();
      const [layer, ll] = select(msg("live.layer"), [...Array(L).keys()]);
      const [head, hl] = select(msg("live.head"), [...Array(H).keys()]);
      const canvas = element("canvas", { className: "selfattn-live-canvas" });
      canvas.setAttribute("role", "img");
      const caption = element("p", { className: "selfattn-live-caption" });
      // the 72 heads as a group of radio buttons: one tab stop, the arrow keys move between
      // heads (left and right) and layers (up and down), and the head in focus is shown above
      const grid = element("div", { className: "selfattn-live-grid" });
      grid.setAttribute("role", "radiogroup");
      grid.setAttribute("aria-label", msg("live.all_heads", { n: L * H }));
      const gridTitle = element("p", { className: "selfattn-live-caption",
        textContent: msg("live.all_heads_title", { n: L * H }) });
      grid.style.gridTemplateColumns = `auto repeat(${H}, minmax(1.6rem, 1fr))`;
      const thumbs = [];
      grid.append(element("span", { ariaHidden: "true" }));
      for (let h = 0; h < H; h++) grid.append(element("span", { className: "selfattn-live-gridlabel", ariaHidden: "true", textContent: `h${h}` }));
      for (let l = 0; l < L; l++) {
        grid.append(element("span", { className: "selfattn-live-gridlabel", ariaHidden: "true", textContent: msg("live.layer_n", { layer: l }) }));
        for (let h = 0; h < H; h++) {
          const t = element("button", { type: "button", className: "selfattn-live-thumb", tabIndex: -1 },
            [element("canvas", {})]);
          t.setAttribute("role", "radio");
          t.setAttribute("aria-label", msg("live.layer_head", { layer: l, head: h }));
          t.addEventListener("click", () => pick(l, h));
          grid.append(t);
          thumbs.push([t, l, h]);
        }
      }
      function pick(l, h, focus) {
        layer.value = String(l); head.value = String(h); draw();
        if (focus) thumbs[l * H + h][0].focus();
      }
      const MOVES = { ArrowLeft: [0, -1], ArrowRight: [0, 1], ArrowUp: [-1, 0], ArrowDown: [1, 0] };
      grid.addEventListener("keydown", (event) => {
        const l = Number(layer.value), h = Number(head.value);
        let to = null;
        if (MOVES[event.key]) to = [l + MOVES[event.key][0], h + MOVES[event.key][1]];
        else if (event.key === "Home") to = [l, 0];
        else if (event.key === "End") to = [l, H - 1];
        if (!to) return;
        event.preventDefault();
        pick(Math.min(L - 1, Math.max(0, to[0])), Math.min(H - 1, Math.max(0, to[1])), true);
      });
      const examples = element("div", { className: "selfattn-live-examples" }, [msg("live.try")]);
      spec.sentences.forEach((s) => {
        const b = element("button", { type: "button", textContent: s });
        b.addEventListener("click", () => { input.value = s; typed(); });
        examples.append(b, " ");
      });
      const gridBox = element("div", { className: "selfattn-live-gridbox" }, [grid]);
      div.append(element("div", { className: "selfattn-live-controls" }, [label, input, ll, hl]),
        examples, message, canvas, caption, gridTitle, gridBox, region);

      let last = null, busy = false, pending = null;
      function draw(quiet) { // quiet: a redraw for a change of theme is not said
        if (!last) return;
        const { data, T, tokens, ms } = last, l = Number(layer.value), h = Number(head.value);
        drawHeatmap(canvas, headRows(data, T, l, h, H), tokens, null, spec.colors, msg("live.layer_head", { layer: l, head: h }));
        canvas.setAttribute("aria-label", msg("live.minilm_canvas", { layer: l, head: h, tokens: tokens.join(" ") }));
        for (const [t, tl, th] of thumbs) {
          drawThumbnail(t.firstChild, data, T, tl, th, H, spec.colors);
          const on = tl === l && th === h;
          t.classList.toggle("selected", on);
          t.setAttribute("aria-checked", String(on));
          t.tabIndex = on ? 0 : -1;
        }
        caption.textContent = msg("live.minilm_caption", { n: T, ms: ms.toFixed(1) }) +
          (tokens.includes("[UNK]") ? msg("live.minilm_unk") : "");
        if (quiet !== true) say(greeting + caption.textContent);
        greeting = "";
      }
      let greeting = msg("live.minilm_ready"); // said once, with the first result
      const views = [canvas, caption, gridBox, gridTitle];
      function hide(text) { // a message instead of a view of other text
        setMessage(text);
        say(text);
        for (const v of views) v.hidden = true;
      }
      async function typed() {
        const started = performance.now();
        const text = input.value;
        if (!text.trim()) return hide(msg("live.type_first"));
        const { ids, tokens } = tokenizer.encode(text);
        if (ids.length > spec.max_pieces)
          return hide(msg("live.too_many_pieces", { n: ids.length, max: spec.max_pieces }));
        if (busy) { pending = true; return; } // only the latest text is computed next
        busy = true;
        const r = await run(ids);
        busy = false;
        if (input.value !== text || pending) { pending = false; return typed(); } // stale: redo
        setMessage("");
        for (const v of views) v.hidden = false;
        last = { data: r.attentions, T: r.T, tokens, ms: r.ms };
        draw();
        explorer.timings.push({ pieces: r.T, inference_ms: r.ms, total_ms: performance.now() - started });
      }
      input.addEventListener("input", typed);
      layer.addEventListener("change", draw);
      head.addEventListener("change", draw);
      new MutationObserver(() => draw(true)).observe(document.documentElement, { attributes: true, attributeFilter: ["data-theme"] });
      typed();
      input.focus(); // the button that had the focus is gone: the reader goes on in the box
    }
  }

  const api = { explorers: {}, compute, tokenize, InputError };
  root.selfattnLive = api;
  if (typeof document !== "undefined") {
    const start = () => document.querySelectorAll("div.selfattn-live").forEach(mount);
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
    else start();
  }
})(typeof window !== "undefined" ? window : globalThis);
