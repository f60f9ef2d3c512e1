"""Byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2/3, SmolLM2), read from a Hugging Face ``tokenizer.json``.

One concept a module: `pretokenizer` splits text into pieces (added tokens, the file's pre-tokenizer
stages, the byte-level alphabet); `reader` reads and checks the files (tokenizer.json, vocab.json +
merges.txt, the sidecars of a model folder); `bpe` holds the `Tokenizer` (BPE merges, the piece cache,
encoding and decoding). Every public name is importable from `inferno.tokenizer`.
"""

from inferno.tokenizer.bpe import IncrementalDecoder, Tokenizer
from inferno.tokenizer.pretokenizer import PATTERN, PreTokenizer, _has_newer_chars, bytes_to_unicode  # noqa: F401
from inferno.tokenizer.reader import MAX_TOKENIZER_BYTES, TokenizerError  # noqa: F401

__all__ = ["PATTERN", "IncrementalDecoder", "PreTokenizer", "Tokenizer", "TokenizerError", "bytes_to_unicode"]
