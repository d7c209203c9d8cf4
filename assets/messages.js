/* The text the book's scripts write into a page (assets/selfcheck.js: the self-checks' verdicts
   and labels; assets/live/live.js: the live explorers' labels, captions and messages), in each
   edition's language: the English edition at the site's root, the Chinese one under zh/
   (tools/i18n.py). A classic script, loaded before both (html_js_files in _config.yml).

   window.selfattnMessages.t(key, params) -> the message for the page's language
   (document.documentElement.lang: "zh-CN" in the Chinese edition; English for any other, and
   where there is no document, as in the Node tests), with each {name} replaced by params.name.
   Every key has an English message and a Chinese one (tests/test_i18n.py), with the same
   {names}; tools/cjk_font.py reads this file, so the page's font has every Chinese character. */
(function (root) {
  "use strict";

  var MESSAGES = {
    en: {
      // assets/selfcheck.js
      "sc.check": "Check",
      "sc.your_answer": "Your answer.",
      "sc.placeholder.number": "a number, e.g. 0.5, 1e6 or 2**20",
      "sc.placeholder.count": "a whole number, e.g. 1,024 or 2**10",
      "sc.placeholder.shape": "a shape, e.g. (2, 8, 16)",
      "sc.placeholder.bytes": "bytes, e.g. 1,536, 2**20 or 3 MiB",
      "sc.read.number": "Can't read that as a number: write it like 0.25, 1,024, 1e6 or 2**20.",
      "sc.read.count": "Can't read that as a whole number: write it like 1,024, 1e6 or 2**20.",
      "sc.read.shape": "Can't read that as a shape: write it like (2, 8, 16).",
      "sc.read.bytes": "Can't read that as a number of bytes: write it like 1,536, 2**20 or " +
        "3 MiB (KiB, MiB, GiB, TiB are powers of 2; kB, MB, GB, TB powers of 10).",
      "sc.no_unit": "This answer is a plain number, not bytes: write it without a unit, " +
        "like 1,024 or 2**20.",
      "sc.empty": "Type an answer, then Check.",
      "sc.right": "\u2713 Right.",
      "sc.not_yet": "\u2717 Not yet: {what}",
      "sc.more_dims": "the answer has more dimensions than yours.",
      "sc.fewer_dims": "the answer has fewer dimensions than yours.",
      "sc.off_one": "{dim} is not right",
      "sc.off_many": "{dims} and {last} are not right",
      "sc.list_sep": ", ",
      "sc.rest_right": "; the rest are.",
      "sc.end": ".",
      "sc.decimal_unit": "a {unit} is a power of 10 bytes, a {binary} a power of 2: your " +
        "number is right in {binary}.",
      "sc.size_in": "that is the size in {unit}, and a number alone is read as bytes: write " +
        "the unit ({text} {unit}) or the bytes.",
      "sc.close_count": "close (within 1%), but {why}: {then}",
      "sc.not_exact": "not exact",
      "sc.is_whole": "the answer is a whole number",
      "sc.exact_bytes": "give the exact number of bytes, or an exact value with a unit such " +
        "as MiB or GiB.",
      "sc.exact_count": "give the exact count, every digit.",
      "sc.whole": "the answer is a whole number.",
      "sc.more_digits": "close (within 1%), but not close enough: give more digits.",
      "sc.too_high": "too high.",
      "sc.too_low": "too low.",
      // assets/live/live.js
      "live.type_first": "Type a sentence first.",
      "live.too_many_words": "That is {n} words; this view takes at most {max}.",
      "live.unknown_word": "The word \u201c{word}\u201d is not in this model's vocabulary. " +
        "It knows: {vocab}",
      "live.dropped": "; punctuation left out: {chars}",
      "live.axis_key": "key (attended to)",
      "live.axis_query": "query (attending)",
      "live.weight": "weight",
      "live.sentence": "sentence",
      "live.vocab": "Words this model knows: {vocab} (any other word gets a message; " +
        "punctuation is left out)",
      "live.temperature": "temperature",
      "live.mask": "mask",
      "live.model": "model",
      "live.head": "head",
      "live.layer": "layer",
      "live.try": "try: ",
      "live.title_mask": "temperature {t}, {mask} mask",
      "live.title_no_mask": "temperature {t}, no mask",
      "live.title_head": "head {head}",
      "live.canvas": "attention weights, {title}: {tokens}",
      "live.entropy": "mean row entropy {mean} nats (uniform: {uniform})",
      "live.no_saw": "No \u201csaw\u201d in this sentence: type one to see its tag.",
      "live.saw_says": "\u201csaw\u201d (word {n}): the model says {tag}; ",
      "live.saw_outside": "the task's sentences have one \u201csaw\u201d and one cue before it, " +
        "so no rule applies here",
      "live.saw_rule": "the task's rule says {tag}",
      "live.saw_sep": ". ",
      "live.latest": "the model's tag (the latest cue) agrees with the rule on {agree} of " +
        "{n} tokens; last token: {last}",
      "live.minilm_file": "To run MiniLM live in this page, serve the book instead of opening " +
        "the file: python3 -m http.server --directory _build/html, then open " +
        "http://localhost:8000. The precomputed explorer below works here.",
      "live.minilm_button": "Compute MiniLM's attention live in this page (downloads {mb} MB " +
        "once)",
      "live.minilm_intro": "The model ({model} MB, float16 weights), the runtime " +
        "(onnxruntime-web, {runtime} MB) and the vocabulary ({vocab} MB) come from this site " +
        "only when you press the button; your browser keeps them afterwards.",
      "live.minilm_progress": "downloading the model: {loaded} of {total} MB",
      "live.minilm_failed": "MiniLM could not start: {error}",
      "live.minilm_ready": "MiniLM is ready. ",
      "live.all_heads": "All {n} heads",
      "live.all_heads_title": "All {n} heads: click one, or use the arrow keys here (or the " +
        "layer and head menus), to show it above.",
      "live.layer_n": "layer {layer}",
      "live.layer_head": "layer {layer}, head {head}",
      "live.minilm_canvas": "MiniLM attention, layer {layer}, head {head}: {tokens}",
      "live.minilm_caption": "{n} word pieces; the model took {ms} ms in this browser",
      "live.minilm_unk": ". [UNK] stands for a character MiniLM's English vocabulary does not " +
        "have (most Chinese characters, emoji): the model sees one unknown token in its " +
        "place, so the attention to and from it says little",
      "live.too_many_pieces": "That is {n} word pieces; this view takes at most {max}.",
    },
    "zh-CN": {
      "sc.check": "检查",
      "sc.your_answer": "你的答案。",
      "sc.placeholder.number": "一个数，例如 0.5、1e6 或 2**20",
      "sc.placeholder.count": "一个整数，例如 1,024 或 2**10",
      "sc.placeholder.shape": "一个形状，例如 (2, 8, 16)",
      "sc.placeholder.bytes": "字节数，例如 1,536、2**20 或 3 MiB",
      "sc.read.number": "无法把它读作一个数：请写成 0.25、1,024、1e6 或 2**20 这样的形式。",
      "sc.read.count": "无法把它读作一个整数：请写成 1,024、1e6 或 2**20 这样的形式。",
      "sc.read.shape": "无法把它读作一个形状：请写成 (2, 8, 16) 这样的形式。",
      "sc.read.bytes": "无法把它读作字节数：请写成 1,536、2**20 或 3 MiB 这样的形式" +
        "（KiB、MiB、GiB、TiB 是 2 的幂；kB、MB、GB、TB 是 10 的幂）。",
      "sc.no_unit": "这个答案是一个纯数，不是字节数：请去掉单位，写成 1,024 或 2**20 这样的形式。",
      "sc.empty": "请先输入答案，再点“检查”。",
      "sc.right": "\u2713 正确。",
      "sc.not_yet": "\u2717 还不对：{what}",
      "sc.more_dims": "正确答案的维数比你的多。",
      "sc.fewer_dims": "正确答案的维数比你的少。",
      "sc.off_one": "{dim} 不对",
      "sc.off_many": "{dims} 和 {last} 不对",
      "sc.list_sep": "、",
      "sc.rest_right": "；其余的都对。",
      "sc.end": "。",
      "sc.decimal_unit": "{unit} 是 10 的幂个字节，{binary} 是 2 的幂：你的数以 {binary} " +
        "为单位时是对的。",
      "sc.size_in": "这是以 {unit} 为单位的大小，而单独一个数会按字节读：请写上单位" +
        "（{text} {unit}）或写出字节数。",
      "sc.close_count": "很接近（相差在 1% 以内），但{why}：{then}",
      "sc.not_exact": "不精确",
      "sc.is_whole": "答案是一个整数",
      "sc.exact_bytes": "请给出精确的字节数，或带 MiB、GiB 等单位的精确值。",
      "sc.exact_count": "请给出精确的计数，每一位都要写出。",
      "sc.whole": "答案是一个整数。",
      "sc.more_digits": "很接近（相差在 1% 以内），但还不够接近：请多给几位数字。",
      "sc.too_high": "太大了。",
      "sc.too_low": "太小了。",
      "live.type_first": "请先输入一个句子。",
      "live.too_many_words": "这是 {n} 个词；这个视图最多接受 {max} 个。",
      "live.unknown_word": "词\u201c{word}\u201d不在这个模型的词表里。它认识的词：{vocab}",
      "live.dropped": "；已忽略的标点：{chars}",
      "live.axis_key": "键（被关注的）",
      "live.axis_query": "查询（发出关注的）",
      "live.weight": "权重",
      "live.sentence": "句子",
      "live.vocab": "这个模型认识的词：{vocab}（其他词会得到一条提示；标点会被忽略）",
      "live.temperature": "温度",
      "live.mask": "掩码",
      "live.model": "模型",
      "live.head": "头",
      "live.layer": "层",
      "live.try": "试试：",
      "live.title_mask": "温度 {t}，{mask} 掩码",
      "live.title_no_mask": "温度 {t}，无掩码",
      "live.title_head": "头 {head}",
      "live.canvas": "注意力权重，{title}：{tokens}",
      "live.entropy": "行熵的平均值 {mean} 奈特（均匀分布：{uniform}）",
      "live.no_saw": "这个句子里没有\u201csaw\u201d：输入一个，看看它的标签。",
      "live.saw_says": "\u201csaw\u201d（第 {n} 个词）：模型给出 {tag}；",
      "live.saw_outside": "任务中的句子都只有一个\u201csaw\u201d，且它前面恰有一个线索词；" +
        "这个句子不是这样，所以没有规则适用",
      "live.saw_rule": "任务的规则给出 {tag}",
      "live.saw_sep": "。",
      "live.latest": "模型的标签（最近的线索）在 {n} 个词元中有 {agree} 个与规则一致；" +
        "最后一个词元：{last}",
      "live.minilm_file": "要在本页实时运行 MiniLM，请通过服务器打开本书，而不是直接打开文件：" +
        "python3 -m http.server --directory _build/html，然后打开 http://localhost:8000。" +
        "下面预先计算好的探索器在这里也能用。",
      "live.minilm_button": "在本页实时计算 MiniLM 的注意力（只下载一次，{mb} MB）",
      "live.minilm_intro": "模型（{model} MB，float16 权重）、运行时（onnxruntime-web，" +
        "{runtime} MB）和词表（{vocab} MB）只在你按下按钮时从本站下载；之后浏览器会保存它们。",
      "live.minilm_progress": "正在下载模型：{loaded} / {total} MB",
      "live.minilm_failed": "MiniLM 无法启动：{error}",
      "live.minilm_ready": "MiniLM 已就绪。",
      "live.all_heads": "全部 {n} 个头",
      "live.all_heads_title": "全部 {n} 个头：点击其中一个，或在这里用方向键（也可以用层和头的" +
        "菜单），把它显示在上方。",
      "live.layer_n": "第 {layer} 层",
      "live.layer_head": "第 {layer} 层，头 {head}",
      "live.minilm_canvas": "MiniLM 的注意力，第 {layer} 层，头 {head}：{tokens}",
      "live.minilm_caption": "{n} 个词片；模型在这个浏览器里用了 {ms} 毫秒",
      "live.minilm_unk": "。[UNK] 代表 MiniLM 的英文词表里没有的字符（大多数汉字、表情符号）：" +
        "模型在它的位置只看到一个未知词元，所以指向它和从它发出的注意力说明不了什么",
      "live.too_many_pieces": "这是 {n} 个词片；这个视图最多接受 {max} 个。",
    },
  };

  function lang() {
    var page = typeof document !== "undefined" && document.documentElement ?
      document.documentElement.lang : "";
    return MESSAGES.hasOwnProperty(page) ? page : "en";
  }

  function t(key, params) {
    var table = MESSAGES[lang()];
    var text = table.hasOwnProperty(key) ? table[key] : MESSAGES.en[key];
    if (text === undefined) throw new Error("no message " + key);
    return text.replace(/\{(\w+)\}/g, function (all, name) {
      if (!params || !params.hasOwnProperty(name)) throw new Error(key + " needs " + name);
      return String(params[name]);
    });
  }

  root.selfattnMessages = { MESSAGES: MESSAGES, lang: lang, t: t };
})(typeof window !== "undefined" ? window : globalThis);
