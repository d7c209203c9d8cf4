// BERT WordPiece tokenizer for all-MiniLM-L6-v2, in plain JavaScript with no dependencies.
//
// It equals the Hugging Face `tokenizers` pipeline of the model's tokenizer.json as
// selfattn.book.pretrained.load() configures it (no_padding, no_truncation):
//   added tokens        [PAD] [UNK] [CLS] [SEP] [MASK], matched in the raw text first
//   BertNormalizer      clean_text, handle_chinese_chars, strip_accents (NFD, drop Mn), lowercase
//   BertPreTokenizer    split on whitespace; each punctuation character is a word of its own
//   WordPiece           greedy longest match, "##" before a continuation; [UNK] for a word with
//                       no split or longer than max_input_chars_per_word (100)
//   TemplateProcessing  [CLS] ... [SEP]
// Text is walked by code point, so an emoji is one character, as in Rust. Character classes
// come from the browser's Unicode tables, those of `tokenizers` from Unicode 8.0 (2015): the
// two differ only on marks, format and punctuation characters added or recategorised since.
// tests/test_wordpiece.py checks it against the Python tokenizer.
//
// Load it with <script> or importScripts() (it sets the global SelfattnWordPiece) or require()
// in Node. SelfattnWordPiece.fromVocab(text) takes the vocabulary, one token a line in id order,
// and returns {encode(text)}, which gives {ids, tokens} with [CLS] and [SEP].
(function (root, factory) {
  if (typeof module === "object" && module.exports) module.exports = factory();
  else root.SelfattnWordPiece = factory();  // no AMD branch: the book's pages load require.js
})(typeof self !== "undefined" ? self : this, function () {
  "use strict";
  const ADDED = /(\[(?:PAD|UNK|CLS|SEP|MASK)\])/;  // tokenizer.json's added_tokens
  const CONTROL = /^(?![\t\n\r])[\p{Cc}\p{Cf}\p{Co}\p{Cs}]$/u;  // Rust's is_other (no Cn)
  const PUNCT = "!-\\/:-@\\[-`{-~\\p{P}";  // ASCII punctuation (also $+<=>^`|~) and Unicode P*
  const WORD = new RegExp(`[${PUNCT}]|[^${PUNCT} ]+`, "gu");  // the words between spaces
  const MAX_CHARS = 100;
  // The CJK ideograph blocks, as Rust's is_chinese_char has them (0x2B920, where BERT's
  // Python has 0x2B820: U+2B820 to U+2B91F are not split off)
  const CJK = [[0x4E00, 0x9FFF], [0x3400, 0x4DBF], [0x20000, 0x2A6DF], [0x2A700, 0x2B73F],
    [0x2B740, 0x2B81F], [0x2B920, 0x2CEAF], [0xF900, 0xFAFF], [0x2F800, 0x2FA1F]];

  function normalize(text) {
    let out = "";
    for (const ch of text) {  // code points, not UTF-16 units
      const cp = ch.codePointAt(0);
      if (cp === 0 || cp === 0xFFFD || CONTROL.test(ch)) continue;  // clean_text drops these
      if (/^\p{White_Space}$/u.test(ch)) out += " ";
      else if (CJK.some(([lo, hi]) => lo <= cp && cp <= hi)) out += ` ${ch} `;  // own word
      else out += ch;
    }
    out = out.normalize("NFD").replace(/\p{Mn}/gu, "");  // strip accents
    // Lowercase each code point alone, as Rust's to_lowercase does: a final Σ gives σ, not ς.
    return Array.from(out, (c) => c.toLowerCase()).join("");
  }

  function fromVocab(vocabText) {
    const vocab = new Map();
    vocabText.split(/\r?\n/).forEach((token, id) => { if (token) vocab.set(token, id); });

    function wordPiece(word) {
      const chars = Array.from(word), pieces = [];
      if (chars.length > MAX_CHARS) return ["[UNK]"];
      for (let start = 0, end; start < chars.length; start = end) {
        let piece;  // the longest piece from start that is in the vocabulary
        for (end = chars.length; end > start; end--) {
          piece = (start ? "##" : "") + chars.slice(start, end).join("");
          if (vocab.has(piece)) break;
        }
        if (end === start) return ["[UNK]"];  // no piece fits: the whole word is unknown
        pieces.push(piece);
      }
      return pieces;
    }

    function encode(text) {
      const tokens = ["[CLS]"];
      text.split(ADDED).forEach((part, i) => {
        if (i % 2) tokens.push(part);  // odd parts are the added tokens themselves
        else for (const word of normalize(part).match(WORD) || []) tokens.push(...wordPiece(word));
      });
      tokens.push("[SEP]");
      return { ids: tokens.map((t) => vocab.get(t)), tokens };
    }

    return { encode };
  }

  return { fromVocab };
});
