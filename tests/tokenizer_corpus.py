"""A seeded corpus of varied strings for comparing tokenizers id for id (tests/test_tokenizer_families.py).

Code, emoji (with joiners, flags, skin tones), CJK and other scripts, numbers of every length, whitespace
runs (spaces, tabs, CR/LF, Unicode spaces), contractions in any case, combining marks (NFC matters for
Qwen), letters newer than Unicode 16, and look-alikes of special tokens (``<|endoftext|>``,
``<|im_start|>``, ``<|begin_of_text|>`` whole, broken and nested).
"""

from __future__ import annotations

import random

SPECIAL_LOOKALIKES = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|end_of_text|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<think>", "</think>", "<tool_call>",
    "<|endoftext", "endoftext|>", "<|im_start", "<||>", "<|<|im_end|>|>", "<|reserved_special_token_7|>",
    "<|reserved_special_token_999|>", "<|EOT_ID|>", "< |eot_id| >", "<<|eot_id|>>", "<s>", "</s>", "[INST]",
]
CODE = [
    "def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}", "if x != None:",
    "  const re = /^\\s+|\\s+$/g;", "SELECT * FROM t WHERE id=42;", "<div class=\"a\">&nbsp;</div>",
    "x=>x*2", "#include <stdio.h>", "fn main() { println!(\"{}\", 1_000_000); }", "```python\nprint(1)\n```",
    "λx.x", "a->b", "::", "   \n\n   \t", "\r\n\r\n", "path/to/file.txt", "https://example.com/?q=1&r=2",
    "{\"key\": [1, 2.5e-3, null]}", "$ ls -la | grep '^d'", "__init__", "camelCaseName", "SHOUT_CASE_X",
]
WORDS = [
    "hello", "world", "The", "quick", "brown", "fox", "I'm", "you're", "they'LL", "WE'VE", "it's", "IT'S",
    "don't", "DON'T", "she'd", "He'S", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "’s", "O'Neil",
    "naïve", "café", "résumé", "Straße", "ΑΒΓ", "привет", "Мир", "שלום", "مرحبا", "नमस्ते", "ไทย", "한국어",
    "日本語", "中文", "你好", "世界", "こんにちは", "カタカナ", "ｆｕｌｌ", "ﬁ", "Ⅻ", "½", "²", "𝔘𝔫𝔦",
    "😀", "👍🏽", "👨\u200d👩\u200d👧", "🇺🇸", "🏳️\u200d🌈", "❤️", "e\u0301", "a\u0308", "\u1100\u1161",
    "Å", "Å", "\u0558", "\ua7ce", "\U00016ea0", "x\u0c5c1", "\u00ad", "\u200b", "\ufeff", "\u2028",
]
NUMBERS = ["0", "7", "42", "123", "1234", "12345", "1234567890", "3.14159", "-1", "1e10", "1,000,000", "٣٤",
           "१२३", "0x1F", "v1.2.3", "2026-12-04", "12:30", "１２３"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2003", "\x0b", "\x0c",
          "\x85", " \t\n", "    "]
BLOCKS = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF), (0x900, 0x97F),
          (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x3040, 0x30FF), (0x4E00, 0x4FFF),
          (0xAC00, 0xAD00), (0xFF00, 0xFFEF), (0x1F300, 0x1F64F), (0x1D400, 0x1D4FF), (0x20000, 0x200FF)]


def _random_chars(rng: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        lo, hi = rng.choice(BLOCKS)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def corpus(n: int = 3000, seed: int = 0) -> list[str]:
    """`n` strings, the same for the same seed: each a mixture of a few of the pools above."""
    rng = random.Random(seed)
    pools = [WORDS, WORDS, CODE, NUMBERS, SPACES, SPECIAL_LOOKALIKES]
    texts = list(dict.fromkeys([*WORDS, *CODE, *NUMBERS, *SPACES, *SPECIAL_LOOKALIKES]))
    seen = set(texts)
    while len(texts) < n:
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.08:
                parts.append(_random_chars(rng, rng.randint(1, 6)))
            elif r < 0.12:
                parts.append(rng.choice(SPACES) * rng.randint(2, 20))
            elif r < 0.15:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 15))))
            else:
                parts.append(rng.choice(rng.choice(pools)))
            if rng.random() < 0.5:
                parts.append(rng.choice([" ", "", "\n", ", ", ". ", "'", "  "]))
        text = "".join(parts)
        if text not in seen:
            seen.add(text)
            texts.append(text)
    return texts[:n]
