#include "tests/engine/text/text_corpus.hpp"

#include <string_view>

namespace troupe::text::testing {

namespace {

class rng {
 public:
  explicit rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // In [0, n).
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }
  bool chance(int percent) { return below(100) < static_cast<std::size_t>(percent); }

 private:
  std::uint64_t s_;
};

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

template <class T, std::size_t N>
const T& pick(rng& r, const T (&pool)[N]) {
  return pool[r.below(N)];
}

// Words and phrases by script; some letters are written decomposed (NFD) on purpose.
constexpr std::string_view latin[] = {
    "hello", "world", "The", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "naïve", "café", "résumé",
    "fac\u0327ade", "jalapeño", "Straße", "Ærøskøbing", "Œuvre", "İstanbul", "ŁÓDŹ", "ﬁnance", "don't", "I'm",
    "we'll", "they've", "she'd", "it's", "IT'S", "WE'LL", "ſtate", "Kelvin", "ﬀ", "señor", "mañana",
    "cre\u0300me bru\u0302le\u0301e", "Åström", "A\u030angström", "Zürich", "Zu\u0308rich", "Øresund",
    "Dvořák", "Ğ", "ǅemal", "ǈ", "ĳssel", "ŉ", "the", "of", "and", "tokenization", "internationalization",
    "supercalifragilisticexpialidocious", "HTTPServerError", "camelCaseWord", "snake_case_word", "kebab-case",
    "O'Neil", "rock'n'roll", "e.g.", "i.e.", "U.S.A.", "Mr.", "Dr.", "vs.", "etc."};
constexpr std::string_view cyrillic[] = {"Привет", "мир", "Съешь", "же", "ещё", "этих", "мягких",
                                         "французских", "булок", "ЁЛКА", "й", "и\u0306", "Україна", "Ґ",
                                         "Беларусь", "ў", "Српски", "љубав", "Қазақ"};
constexpr std::string_view greek[] = {"Καλημέρα", "κόσμε", "Ελληνικά", "ΣΊΣΥΦΟΣ", "ς", "σοφία", "ά",
                                      "α\u0301", "ΐ", "Ω", "Ω", "µ", "μ"};
constexpr std::string_view arabic[] = {"مرحبا", "بالعالم", "العربية", "٣٤٥", "۱۲۳", "كِتَابٌ", "ﻻ", "لا",
                                       "السلام عليكم", "فارسی", "اردو"};
constexpr std::string_view hebrew[] = {"שלום", "עולם", "עִבְרִית", "ירושלים", "ﬡ"};
constexpr std::string_view devanagari[] = {"नमस्ते", "दुनिया", "हिन्दी", "क्षत्रिय", "१२३", "संस्कृतम्", "क़",
                                           "क\u093c", "मराठी"};
constexpr std::string_view thai[] = {"สวัสดีชาวโลก", "ภาษาไทย", "กรุงเทพมหานคร", "๑๒๓", "ำ", "เ"};
constexpr std::string_view cjk[] = {"你好世界", "中文分词测试", "漢字", "東京都", "北京大学", "龘", "𠀀",
                                    "𪚥", "丶", "一二三", "壹贰叁", "〇", "，", "。", "「引用」", "《书名》"};
constexpr std::string_view hangul[] = {"안녕하세요", "세계", "한국어", "\u1100\u1161\u11a8", "각", "ㄱㄴㄷ",
                                       "똠방각하"};
constexpr std::string_view kana[] = {"こんにちは", "カタカナ", "ひらがな", "ｶﾀｶﾅ", "ガ", "ｶﾞ", "か\u3099",
                                     "日本語のテキスト", "ー", "ゟ", "ヿ", "㍿"};
constexpr std::string_view emoji[] = {
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇯🇵", "🇺🇸", "🇩🇪🇫🇷", "❤️", "🧑🏿‍💻", "👩🏻‍🦰", "🤷‍♂️", "✊🏾",
    "1️⃣", "🫠", "🙏", "🔥🔥🔥", "😂😂", "🐍", "🦀", "☕", "✅", "⚠️", "©", "™", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "👁️‍🗨️"};
constexpr std::string_view code[] = {
    "int main() {\n    return 0;\n}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }",
    "def f(x):\n    if x > 0:\n        return x ** 2\n    return -x\n",
    "for (let i = 0; i < n; i++) { console.log(`i=${i}`); }",
    "fn main() {\n\tlet v: Vec<u8> = vec![1, 2, 3];\n\tprintln!(\"{:?}\", v);\n}",
    "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hi\") }\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "<div class=\"box\"><p>Hello &amp; welcome</p></div>",
    "#!/usr/bin/env bash\nset -euo pipefail\necho \"$HOME\" | tr a-z A-Z\n",
    "x = [i*i for i in range(10) if i % 2 == 0]",
    "std::vector<std::pair<int, std::string>> v{{1, \"a\"}};",
    "const obj = { key: 'value', 'other-key': [1, 2, 3], nested: { a: null } };",
    "if (a && b || !c) { x += 1; } else { x -= 1; }",
    "// comment\n/* block\n   comment */\n",
    "    \t  indented_with_tabs_and_spaces();\r\n",
    "{\"json\": true, \"n\": -1.5e-10, \"s\": \"\\u00e9\"}",
    "a=1;b=2;c=a+b;print(c)",
    "$ ls -la /tmp && cd ~/src/troupe",
    "http://example.com/path?query=1&other=two#frag",
    "user@example.org",
    "λx.λy.x",
    "∀x∈ℝ: x² ≥ 0",
    "E = mc²",
    "H₂O + CO₂",
    "½ ¼ ¾",
    "℃ ℉ № ℡ ™"};
constexpr std::string_view whitespace[] = {" ", "  ", "   ", "\t", "\t\t", "\n", "\r\n", "\n\n", "\n\n\n",
                                           "   \n", " \t \n ", "\u00a0", "\u3000", "\u2003", "\u0085", "\u180e",
                                           "\u2028", "\u200b", "\u2009", "\r", "\v", "\f", "\n \n", "\u202f"};
constexpr std::string_view controls[] = {"\x01", "\x1b[31m", "\x7f", "\u0080", "\u009f", "\u200d", "\u200c",
                                         "\u2066", "\u202e", "\ufeff", "\ufffd", "\uffff", "\U0010ffff", "\u00ad",
                                         "\x08", "\x1f"};
constexpr std::string_view escapes[] = {"\\ud800", "\\uDFFF", "\\x00", "%ED%A0%80", "\\U0001F600", "\\n",
                                        "\\\\", "&#x1F600;", "&lt;s&gt;", "\\u003cs\\u003e", "0xFF", "\\0"};
constexpr std::string_view specials[] = {
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<pad>", "<bos>", "<eos>",
    "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<|reserved_special_token_5|>", "<start_of_turn>",
    "<end_of_turn>", "<|start|>", "<|message|>", "<|channel|>", "<|return|>", "<think>", "</think>",
    "<tool_call>", "</tool_call>", "<|im_", "im_start|>", "<|", "|>", "</", "s>", "<s", "<<s>>", "<0x41>",
    "<0xFF>", "<mask>", "[multimodal]", "<start_of_image>", "<|fim_prefix|>", "<|vision_start|>", "<|User|>",
    "<｜tool▁calls▁begin｜>", "<|constrain|>", "<|reserved_200000|>", "<|im_start|>user\n", "<|im_end|>\n",
    "<|im_start|><|im_end|>", "</s></s>", "<s><s>", "< s >", "<S>", "<|IM_START|>"};
constexpr std::string_view fullwidth[] = {"ＡＢＣ", "１２３", "！？", "ｈｅｌｌｏ", "（全角）", "＠＃＄", "～",
                                          "ﾟ", "㈱", "①②③", "Ⅻ", "ⅷ", "𝐀𝐁𝐂", "𝕏", "ﬃ"};
constexpr std::string_view punctuation[] = {".", ",", "!", "?", ";", ":", "...", "…", "—", "–", "-", "(", ")",
                                            "[", "]", "{", "}", "\"", "'", "`", "’", "‘", "“", "”", "«", "»",
                                            "¿", "¡", "/", "\\", "|", "@", "#", "$", "%", "^", "&", "*", "_",
                                            "+", "=", "<", ">", "~", "'s", "'S", "'ll", "’s", "'re", "'VE"};

// Whole sentences, the fixed part of the corpus.
constexpr std::string_view sentences[] = {
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "",
    " ",
    "\n",
    "a",
    "I'm sure it's fine, isn't it? They'll see. We've done it. You'd know.",
    "HELLO'S WORLD'LL",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "أبجد هوز حطي كلمن سعفص قرشت ثخذ ضظغ",
    "דג סקרן שט בים מאוכזב ולפתע מצא חברה",
    "ऋषियों को सताने वाले दुष्ट राक्षसों के राजा रावण का सर्वनाश करने वाले विष्णुवतार भगवान श्रीराम",
    "เป็นมนุษย์สุดประเสริฐเลิศคุณค่า กว่าบรรดาฝูงสัตว์เดรัจฉาน",
    "我能吞下玻璃而不伤身体。",
    "いろはにほへと ちりぬるを わかよたれそ つねならむ",
    "키스의 고유조건은 입술끼리 만나야 하고 특별한 기술은 필요치 않다.",
    "Voix ambiguë d'un cœur qui, au zéphyr, préfère les jattes de kiwis.",
    "Pchnąć w tę łódź jeża lub ośm skrzyń fig.",
    "Příliš žluťoučký kůň úpěl ďábelské ódy.",
    "Árvíztűrő tükörfúrógép",
    "Þú sérð ríkið, æ, ég öðlast",
    "1234567890",
    "3.14159265358979323846264338327950288419716939937510",
    "-0.000001",
    "1,000,000.00",
    "2024-01-15T12:34:56Z",
    "192.168.0.1",
    "+1 (555) 123-4567",
    "1e10 2E-5 0x1F 0b1010 0o777",
    "v1.2.3-rc.1+build.5",
    "$1,234.56 €1.234,56 ¥1234 £12",
    "Tab\tseparated\tvalues",
    "Line one\nLine two\r\nLine three\rLine four",
    "\n\n\nparagraph\n\n\n\nanother\n",
    "trailing newlines\n\n",
    "    indented",
    "mixed \t\n whitespace \u00a0 here",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<s>[INST] What is 2+2? [/INST] 4</s>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>",
    "<bos><start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n",
    "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>",
    "<|start|>system<|message|>You are ChatGPT.<|end|><|start|>user<|message|>hi<|end|>",
    "text with </s> inside and <s> too",
    "<|im_start|><|im_start|>nested<|im_end|>",
    "<|im_start",
    "<|im_end|",
    "</s",
    "<unk><unk>",
    "e\u0301e\u0301e\u0301",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034fa\u0308\u0301l\u0358g\u0360o\u0307",
    "🏳️‍🌈🏳️‍⚧️👨‍👨‍👦",
    "👍👍🏻👍🏼👍🏽👍🏾👍🏿",
    "🇺🇳🇪🇺🇬🇧🇨🇳🇮🇳",
    "emoji😀in😀words",
    std::string_view("\0null\0", 6),
    "\x01\x02\x03",
    "\ufeffBOM at start",
    "soft\u00adhyphen",
    "zero\u200bwidth\u200bspace",
    "right\u200fto\u200eleft",
    "ＦＵＬＬ　ＷＩＤＴＨ　ＴＥＸＴ",
    "ｶﾀｶﾅﾃﾞｽ",
    "𝓗𝓮𝓵𝓵𝓸 𝔀𝓸𝓻𝓵𝓭",
    "ﬁﬂﬀﬃﬄ",
    "x\u0085y\u2028z\u2029w",
    "a\u180eb",
    "\\ud83d\\ude00",
    "\"quoted\" 'single' `back`",
    "((((nested))))[[[]]]{{{}}}",
    "!!!???...,,,;;;",
    "a  b   c    d     e",
    "                                                                ",
    "\t\t\t\t\t\t\t\t",
    "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "ababababababababababababababababababababababababab",
    "0000000000000000000000000000000000000000000000000000000",
    "=============================================",
    "-----BEGIN PGP SIGNATURE-----",
    "The year 1999 and 2000; numbers 12345678901234567890.",
};

std::string number(rng& r) {
  std::string s;
  const std::size_t kind = r.below(6);
  const std::size_t len = 1 + r.below(kind == 0 ? 40 : 9);
  if (kind == 1 && r.chance(50)) s += '-';
  for (std::size_t i = 0; i < len; ++i) s += static_cast<char>('0' + r.below(10));
  if (kind == 2) {
    s += '.';
    for (std::size_t i = 0, n = 1 + r.below(8); i < n; ++i) s += static_cast<char>('0' + r.below(10));
  } else if (kind == 3) {
    s += ",";
    s += std::to_string(100 + r.below(900));
  } else if (kind == 4) {
    s += "e";
    if (r.chance(50)) s += '-';
    s += std::to_string(r.below(300));
  } else if (kind == 5) {
    s = "0x";
    for (std::size_t i = 0; i < len; ++i) s += "0123456789abcdefABCDEF"[r.below(22)];
  }
  return s;
}

// Code points from well-established blocks, so every Unicode version involved agrees on them.
std::string soup(rng& r, std::size_t n) {
  static constexpr std::pair<char32_t, char32_t> ranges[] = {
      {0x20, 0x7E},     {0xA0, 0x17F},    {0x300, 0x36F},   {0x370, 0x3FF},   {0x400, 0x4FF},
      {0x590, 0x5F4},   {0x600, 0x6FF},   {0x900, 0x97F},   {0xE01, 0xE5B},   {0x1100, 0x11FF},
      {0x2000, 0x206F}, {0x2070, 0x209C}, {0x20A0, 0x20BF}, {0x2100, 0x218B}, {0x2190, 0x23FF},
      {0x2460, 0x24FF}, {0x3000, 0x303F}, {0x3041, 0x3096}, {0x30A0, 0x30FF}, {0x4E00, 0x9FA5},
      {0xAC00, 0xD7A3}, {0xF900, 0xFA2D}, {0xFB00, 0xFB4F}, {0xFE30, 0xFE4F}, {0xFF01, 0xFFEE},
      {0x1D400, 0x1D6A3}, {0x1F300, 0x1F5FF}, {0x1F600, 0x1F64F}, {0x1F680, 0x1F6C5}, {0x20000, 0x2A6D6}};
  std::string s;
  const auto& [lo, hi] = ranges[r.below(std::size(ranges))];
  for (std::size_t i = 0; i < n; ++i) {
    // Mostly one block per soup, as real text is, with an occasional jump.
    const auto& [a, b] = r.chance(85) ? std::pair{lo, hi} : ranges[r.below(std::size(ranges))];
    append_utf8(s, static_cast<char32_t>(a + r.below(b - a + 1)));
  }
  return s;
}

std::string fragment(rng& r) {
  switch (r.below(16)) {
    case 0: case 1: case 2: return std::string(pick(r, latin));
    case 3: return std::string(pick(r, cyrillic));
    case 4: return std::string(pick(r, greek));
    case 5: return std::string(r.chance(50) ? pick(r, arabic) : pick(r, hebrew));
    case 6: return std::string(r.chance(50) ? pick(r, devanagari) : pick(r, thai));
    case 7: return std::string(r.chance(50) ? pick(r, cjk) : pick(r, hangul));
    case 8: return std::string(pick(r, kana));
    case 9: return std::string(pick(r, emoji));
    case 10: return number(r);
    case 11: return std::string(pick(r, punctuation));
    case 12: return std::string(pick(r, specials));
    case 13: return std::string(r.chance(50) ? pick(r, fullwidth) : pick(r, controls));
    case 14: return std::string(pick(r, escapes));
    default: return soup(r, 1 + r.below(6));
  }
}

std::string separator(rng& r) {
  if (r.chance(70)) return " ";
  if (r.chance(30)) return "";
  return std::string(pick(r, whitespace));
}

std::string mixture(rng& r, std::size_t pieces) {
  std::string s;
  for (std::size_t i = 0; i < pieces; ++i) {
    if (i > 0) s += separator(r);
    s += fragment(r);
  }
  return s;
}

std::string one(rng& r) {
  switch (r.below(10)) {
    case 0: return std::string(pick(r, sentences));
    case 1: {
      std::string s(pick(r, code));
      if (r.chance(50)) s += std::string(pick(r, code));
      return s;
    }
    case 2: return soup(r, 1 + r.below(30));
    case 3: {
      std::string s;
      for (std::size_t i = 0, n = 1 + r.below(6); i < n; ++i) s += number(r) + separator(r);
      return s;
    }
    case 4: {
      std::string s;
      for (std::size_t i = 0, n = 1 + r.below(8); i < n; ++i)
        s += r.chance(50) ? std::string(pick(r, whitespace)) : fragment(r);
      return s;
    }
    case 5: {
      std::string s;
      for (std::size_t i = 0, n = 1 + r.below(5); i < n; ++i)
        s += std::string(pick(r, specials)) + (r.chance(50) ? fragment(r) : "");
      return s;
    }
    default: return mixture(r, 1 + r.below(14));
  }
}

}  // namespace

std::vector<std::string> make_text_corpus(std::size_t count, std::uint64_t seed) {
  rng r(seed);
  std::vector<std::string> out;
  out.reserve(count);
  for (const auto s : sentences)
    if (out.size() < count) out.emplace_back(s);
  for (const auto s : code)
    if (out.size() < count) out.emplace_back(s);
  for (const auto s : specials)
    if (out.size() < count) out.emplace_back(s);
  while (out.size() < count) {
    // One string in a hundred is long: SentencePiece-style models see a whole text as one word.
    if (r.chance(1)) {
      out.push_back(mixture(r, 200 + r.below(400)));
    } else {
      out.push_back(one(r));
    }
  }
  return out;
}

std::vector<std::string> make_text_documents(std::size_t bytes, std::uint64_t seed) {
  rng r(seed);
  std::vector<std::string> docs;
  std::size_t total = 0;
  while (total < bytes) {
    std::string doc;
    const std::size_t target = 1024 + r.below(4096);
    while (doc.size() < target) {
      const std::size_t k = r.below(10);
      if (k < 5) {
        doc += pick(r, sentences);  // prose
      } else if (k < 7) {
        doc += pick(r, code);
      } else {
        doc += mixture(r, 4 + r.below(20));
      }
      doc += r.chance(20) ? "\n\n" : " ";
    }
    total += doc.size();
    docs.push_back(std::move(doc));
  }
  return docs;
}

}  // namespace troupe::text::testing
