#!/usr/bin/env python3
"""Oracle fixtures for the CPU text path: prompt cleaning, the UMT5 tokenizer and the UMT5 encoder.

The real google/umt5-xxl vocabulary cannot be downloaded, so the tests use a small SentencePiece
model TRAINED HERE (unigram, byte_fallback on, T5 id layout: pad 0, eos 1, unk 2, no bos) on a
synthetic corpus of English, Chinese and emoji. Unknown characters (rare Chinese, most emoji) are
left out of the vocabulary on purpose so that both unknown-character behaviours are exercised.

Writes tests/fixtures/text/:
  tokenizer/spiece.model           the trained model
  tokenizer/{tokenizer.json, tokenizer_config.json, special_tokens_map.json}
                                   transformers' T5Tokenizer built from it (save_pretrained), the
                                   files a diffusers `tokenizer/` folder holds
  tokenizer_cases.json             prompts -> cleaned text and token ids from three oracles
  umt5/{config.json, model.safetensors}
                                   a tiny transformers UMT5EncoderModel (random weights, fp32)
  umt5_cases.safetensors           ids, attention masks and the encoder's last_hidden_state

Oracles (see `oracle_tokenize`):
  clean   Wan's `HuggingfaceTokenizer._clean(..., 'whitespace')`: ftfy.fix_text, html.unescape
          twice, strip, re.sub(r'\\s+', ' '), strip (spec §4.3).
  hf      AutoTokenizer.from_pretrained(tokenizer/) with add_special_tokens, padding to max_length,
          truncation (transformers 5: T5Tokenizer always builds its Unigram with byte_fallback off,
          so unknown characters become one fused <unk>).
  hf_bf   the `tokenizers` library on tokenizer.json with model.byte_fallback switched on (what a
          tokenizer.json declaring byte fallback does under transformers 4's T5TokenizerFast).
  spm     the sentencepiece library itself (byte fallback as trained) + EOS, truncated to
          max_length - 1 tokens before the EOS.
The script asserts that hf_bf == spm on the committed prompts without a literal special token (they
agree there; random prompts need not: see src/text/precompiled.h and unigram.h for the differences).

Modes:
  (default)                  regenerate everything under --out
  --oracle IN.json OUT.json  run the oracles on prompts given by a test (used with fresh random
                             prompts); IN = {"tokenizer": dir, "max_length": n, "prompts": [...]}
  --umt5 DIR --seed S        write a fresh tiny UMT5 (HF layout) plus cases into DIR

Usage: .venv/bin/python3 tools/make_text_fixtures.py [--out DIR]
"""
import argparse
import html
import json
import os
import random
import re
import shutil
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "fixtures", "text")
MAX_LENGTH = 512
EXTRA_IDS = 100

DEFAULT_NEG = (
    "色调艳丽，过曝，静态，细节模糊不清，字幕，风格，作品，画作，画面，静止，整体发灰，最差质量，低质量，"
    "JPEG压缩残留，丑陋的，残缺的，多余的手指，画得不好的手部，画得不好的脸部，畸形的，毁容的，形态畸形的肢体，"
    "手指融合，静止不动的画面，杂乱的背景，三条腿，背景人很多，倒着走"
)

# ---------------------------------------------------------------------------------------------
# Cleaning (the reference, verbatim semantics of wan/modules/tokenizers.py)


def basic_clean(text):
    import ftfy

    text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text))
    return text.strip()


def whitespace_clean(text):
    text = re.sub(r"\s+", " ", text)
    return text.strip()


def clean(text):
    return whitespace_clean(basic_clean(text))


# ---------------------------------------------------------------------------------------------
# Tokenizer training


EN_WORDS = (
    "a an the of in on at with and or under over near behind through across into from to by for is are "
    "cat cats dog dogs fox bird birds horse fish dragon robot astronaut woman women man men child children girl "
    "boy old young person people family couple crowd soldier dancer chef knight wizard "
    "runs running walks walking jumps jumping flies flying swims swimming dances dancing sits sitting stands "
    "looks looking smiles smiling laughs cries eats drinks plays playing rides riding fights holding "
    "forest city street night day morning evening rain snow storm fog sunset sunrise sky cloud clouds ocean "
    "sea beach river lake mountain mountains desert field garden park room kitchen window door road bridge "
    "red blue green yellow white black golden silver orange purple pink dark bright soft warm cold "
    "cinematic lighting slow motion camera pans left right zooms close up wide shot aerial view portrait "
    "realistic detailed high quality 4k 8k hdr film grain shallow depth field bokeh vibrant colors style "
    "anime cartoon painting oil watercolor sketch photo photograph render unreal engine "
    "beautiful happy sad angry calm quiet loud small big huge tiny tall short long fast slow gentle "
    "two three four five many some every each his her their its"
).split()
# Frequent Chinese characters (they all become pieces) ...
ZH_COMMON = (
    "色调艳丽过曝静态细节模糊不清字幕风格作品画作画面静止整体发灰最差质量低压缩残留丑陋的缺多余手指得好部脸"
    "畸形毁容态肢融合动杂乱背景三条腿人很倒着走一只猫在森林里奔跑夜晚城市下雨电影感镜头慢缓推近远景特写阳光"
    "海边沙滩山上雪花女孩男子老年轻小狗鸟飞天空云朵红色蓝绿黄白黑金"
)
# ... and rare ones (a single occurrence each: character_coverage drops them -> unknown).
ZH_RARE = "龘靐齉爩麤鱻"
EMOJI_COMMON = ["😀", "🐱", "🔥", "🌧", "🎬"]
EMOJI_RARE = ["🦙", "🧊", "🪐"]
PUNCT = list(",.!?;:'\"-()") + ["，", "。", "！", "？", "、"]


def corpus(rng):
    lines = []
    for _ in range(6000):
        k = rng.random()
        if k < 0.45:
            words = [rng.choice(EN_WORDS) for _ in range(rng.randint(3, 16))]
            if rng.random() < 0.5:
                words[-1] += rng.choice(PUNCT[:4])
            if rng.random() < 0.3:
                words[0] = words[0].capitalize()
            lines.append(" ".join(words))
        elif k < 0.8:
            s = "".join(rng.choice(ZH_COMMON) for _ in range(rng.randint(4, 24)))
            lines.append(s + rng.choice(["，", "。", ""]))
        elif k < 0.95:
            lines.append(" ".join(rng.choice(EN_WORDS + EMOJI_COMMON) for _ in range(rng.randint(3, 10))))
        else:
            lines.append(" ".join(str(rng.randint(0, 2000)) for _ in range(rng.randint(1, 4))))
    # Every printable ASCII character often enough to be a piece (as in a real vocabulary).
    ascii_chars = [chr(c) for c in range(0x21, 0x7F)]
    for _ in range(300):
        lines.append(" ".join("".join(rng.choice(ascii_chars) for _ in range(rng.randint(1, 4)))
                              for _ in range(rng.randint(3, 10))))
    for ch in ZH_RARE + "".join(EMOJI_RARE):
        lines.append("rare " + ch)
    return lines


def train_spm(path):
    import sentencepiece as spm

    rng = random.Random(20250712)
    lines = corpus(rng)
    prefix = os.path.join(tempfile.mkdtemp(), "m")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=prefix, vocab_size=1500, model_type="unigram",
        byte_fallback=True, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=0.9995,
        num_threads=1, seed_sentencepiece_size=100000, shuffle_input_sentence=False,
        minloglevel=2)
    shutil.copyfile(prefix + ".model", path)


# ---------------------------------------------------------------------------------------------
# transformers' T5Tokenizer from the model, without the protobuf package: a minimal protobuf
# wire-format reader for the one field transformers takes from the proto besides the pieces
# (NormalizerSpec.precompiled_charsmap).


def _varint(b, i):
    v = s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return v, i


def _fields(b):
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError("unsupported wire type %d" % wt)
        yield f, wt, v


def spm_charsmap(model_path):
    data = open(model_path, "rb").read()
    for f, wt, v in _fields(data):
        if f == 3 and wt == 2:  # ModelProto.normalizer_spec
            for g, wt2, w in _fields(v):
                if g == 2 and wt2 == 2:  # NormalizerSpec.precompiled_charsmap
                    return bytes(w)
    return None


def build_hf_tokenizer(model_path, out_dir):
    """What transformers' SentencePieceExtractor + T5Converter.convert_from_spm hand T5Tokenizer."""
    import sentencepiece as spm
    from tokenizers import AddedToken
    from transformers import T5Tokenizer

    sp = spm.SentencePieceProcessor(model_file=model_path)
    vocab = [(sp.id_to_piece(i), sp.get_score(i)) for i in range(sp.get_piece_size())]
    extra = [f"<extra_id_{i}>" for i in range(EXTRA_IDS - 1, -1, -1)]
    vocab += [(t, 0.0) for t in extra]
    control = [AddedToken(sp.id_to_piece(i), normalized=False, special=True)
               for i in range(sp.get_piece_size()) if sp.is_control(i)]
    tok = T5Tokenizer(vocab=vocab, unk_id=sp.unk_id(), additional_special_tokens=control + extra,
                      _spm_precompiled_charsmap=spm_charsmap(model_path), extra_ids=EXTRA_IDS)
    tok.save_pretrained(out_dir)
    return tok


# ---------------------------------------------------------------------------------------------
# Oracles


def special_tokens(tok_dir):
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        j = json.load(f)
    return [t["content"] for t in j["added_tokens"] if t.get("special")]


class Oracles:
    def __init__(self, tok_dir, max_length):
        import sentencepiece as spm
        from tokenizers import Tokenizer
        from transformers import AutoTokenizer

        self.max_length = max_length
        self.hf = AutoTokenizer.from_pretrained(tok_dir)
        with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
            j = json.load(f)
        j["model"]["byte_fallback"] = True
        self.hf_bf = Tokenizer.from_str(json.dumps(j))
        self.hf_bf.enable_truncation(max_length)
        self.sp = spm.SentencePieceProcessor(model_file=os.path.join(tok_dir, "spiece.model"))
        self.specials = special_tokens(tok_dir)

    def run(self, prompt, stages=False, check_spm=True):
        c = clean(prompt)
        enc = self.hf(c, add_special_tokens=True, padding="max_length", truncation=True,
                      max_length=self.max_length, return_attention_mask=True)
        n = sum(enc["attention_mask"])
        assert enc["input_ids"][n:] == [0] * (self.max_length - n)
        hf = enc["input_ids"][:n]
        hf_bf = self.hf_bf.encode(c).ids
        spm_ids = self.sp.encode(c)[: self.max_length - 1] + [1]
        if check_spm and not any(s in c for s in self.specials):
            assert hf_bf == spm_ids, (prompt, hf_bf, spm_ids)
        r = {"prompt": prompt, "clean": c, "hf": hf, "hf_bf": hf_bf, "spm": spm_ids}
        if stages:  # the intermediate results, to tell which step differs
            import unicodedata

            import ftfy

            r["nfc"] = unicodedata.normalize("NFC", prompt)
            r["html"] = html.unescape(prompt)
            r["ftfy"] = ftfy.fix_text(prompt)
            r["fix_encoding"] = ftfy.fix_encoding(prompt)
        return r


def tokenizer_prompts():
    long_en = " ".join(["a golden retriever runs across the wide field at sunset"] * 70)
    long_zh = DEFAULT_NEG * 6
    return [
        # plain prompts
        "Two anthropomorphic cats in comfy boxing gear and bright gloves fight intensely on a spotlighted stage.",
        "一只猫在森林里奔跑，电影感镜头，夜晚下雨。",
        "A cat 😀 runs in the forest, 电影感 🔥 slow motion",
        DEFAULT_NEG,
        "",
        "   \t\n  ",
        # unknown characters: rare Chinese, unseen emoji, other scripts
        "rare 龘龘 and 靐 with 🦙🧊 and 🪐 and ✨ and Ωμέγα and привет",
        "a 龘b c🦙d",
        # truncation keeps the EOS
        long_en,
        long_zh,
        # ftfy: quotes, ligatures, width, line breaks, controls, terminal escapes, C1, BOM, NFC
        "\u201cCurly\u201d \u2018quotes\u2019 and \u201aodd\u201b \u201equotes\u201f, it\u02bcs",
        "ﬁne ﬂowers, ﬀ ﬃ ﬄ ﬅ ﬆ, Ĳssel ĳs, ǅ ǈ ǋ ŉ",
        "ＦＵＬＬＷＩＤＴＨ　ｔｅｘｔ，ｈａｌｆｗｉｄｔｈ ｶﾀｶﾅ ﾟ ￦ ￥",
        "line one\r\nline two\rline three\u2028four\u2029five\x85six",
        "bell\x07 tab\tvt\x0b ff\x0c esc\x1b del\x7f \u206a\ufeffbom \ufffb\ufffc end",
        "\x1b[36;44mcolored\x1b[0m text \x1b[1mbold",
        "c1 \x80 \x91quoted\x92 \x93double\x94 \x81 \x8d \x9f end",
        "cafe\u0301 nai\u0308ve A\u030a \u212b \u2126 \ufb01 e\u0301\u0323 \u1100\u1161\u11a8",
        # HTML: double-escaped, named without semicolon, numeric, invalid numeric
        "Tom &amp;amp; Jerry &lt;b&gt;bold&lt;/b&gt; &quot;quoted&quot; &copy 2024 &nbsp;x&nbsp;y",
        "&#x4e00;&#20108; &#65;&#x42; &#128512; &#0; &#x80; &#xD800; &#1114112; &#59; &#x3B;",
        "&EACUTE;t&EACUTE; &Eacute;cole &SZLIG; &AMP; &notit; &ampxyz &amp;notin; &ThisIsNotAnEntity;",
        "a < b &amp; c &gt; d <tag> &EACUTE;",
        "x &amp;amp;amp;lt; y",
        # whitespace: unicode spaces collapse, \x1c-\x1f are whitespace in Python
        "a\u00a0b\u2003c\u3000d\u202fe\u205ff\u1680g\x1ch\x1fi\u200bj\u00ad",
        # literal special tokens
        "before </s> after <pad> x <extra_id_0> y <extra_id_99> <unk> z",
        "<extra_id_7>start and end</s>",
        "glued</s>text and more</s>",
        # mojibake (ftfy.fix_encoding)
        "cafÃ© crÃ¨me, naÃ¯ve â€œquotedâ€\x9d â€” dash",
        "The Mona Lisa doesnâ€™t have eyebrows.",
        "ä¸\u0080å\u008fªç\u008c«",
        "voilÃ  le travail, Ã  bientÃ´t",
        "ĐŃŠĐ¸Đ˛ĐµŃ‚",
        "âœ” No problems",
        "sÃ³ 100Â°C Â£5 Â½",
        "Ã¼ber Ã¤rger MÃ¼nchen",
    ]


# ---------------------------------------------------------------------------------------------
# UMT5


def umt5_config(vocab, layers=2):
    from transformers import UMT5Config

    return UMT5Config(vocab_size=vocab, d_model=64, d_kv=16, d_ff=128, num_layers=layers, num_decoder_layers=0,
                      num_heads=4, relative_attention_num_buckets=32, relative_attention_max_distance=128,
                      feed_forward_proj="gated-gelu", dense_act_fn="gelu_new", layer_norm_epsilon=1e-6,
                      pad_token_id=0, eos_token_id=1, decoder_start_token_id=0, tie_word_embeddings=False)


def build_umt5(out_dir, vocab, seed, seq_len=80, lengths=(80, 37, 1, 61), layers=2):
    """A tiny UMT5EncoderModel with random weights; returns the cases dict (tensors)."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import UMT5EncoderModel

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = UMT5EncoderModel(umt5_config(vocab, layers)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                v = torch.rand(p.shape, generator=gen) + 0.5
            elif "relative_attention_bias" in name:
                v = torch.randn(p.shape, generator=gen)
            elif name == "shared.weight":
                v = torch.randn(p.shape, generator=gen)
            else:
                v = (torch.rand(p.shape, generator=gen) * 2 - 1) * (3.0 / p.shape[1]) ** 0.5
            p.copy_(v)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    # Oracle = the weights read back from the file.
    st = [f for f in os.listdir(out_dir) if f.endswith(".safetensors")]
    assert st == ["model.safetensors"], st
    model = UMT5EncoderModel.from_pretrained(out_dir, torch_dtype=torch.float32).eval()

    B = len(lengths)
    ids = torch.zeros(B, seq_len, dtype=torch.int64)
    mask = torch.zeros(B, seq_len, dtype=torch.int64)
    for b, n in enumerate(lengths):
        ids[b, : n - 1] = torch.randint(2, vocab, (n - 1,), generator=gen)
        ids[b, n - 1] = 1
        mask[b, :n] = 1
    # Padded slots hold random ids too in one row: they must not matter.
    ids[1, lengths[1]:] = torch.randint(2, vocab, (seq_len - lengths[1],), generator=gen)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    # Buckets as torch computes them (float32 log), for |rel| up to 1100 in both directions.
    from transformers.models.umt5.modeling_umt5 import UMT5Attention

    rel = torch.arange(-1100, 1101)
    buckets = UMT5Attention._relative_position_bucket(model.encoder.block[0].layer[0].SelfAttention, rel)
    return {"input_ids": ids.to(torch.int32), "attention_mask": mask.to(torch.int32),
            "last_hidden_state": out.float().contiguous(), "rel_positions": rel.to(torch.int32),
            "buckets": buckets.to(torch.int32)}



# ---------------------------------------------------------------------------------------------
# C++ data tables (src/text/{html_tables,unicode_tables}.cpp), generated from this Python's
# html.entities, unicodedata and ftfy so that the C++ cleaning reproduces exactly the oracle.

TABLE_CODECS = ["latin-1", "sloppy-windows-1252", "sloppy-windows-1251", "sloppy-windows-1250",
                "sloppy-windows-1253", "sloppy-windows-1254", "sloppy-windows-1257", "iso-8859-2",
                "macroman", "cp437"]


def _cstr(s):
    return '"' + "".join("\\%03o" % b if (b < 0x20 or b > 0x7E or chr(b) in '"\\?') else chr(b)
                         for b in s.encode("utf-8")) + '"'


def _rows(items, per_line):
    return "\n".join("    " + " ".join(items[i:i + per_line]) for i in range(0, len(items), per_line))


HEADER = """// GENERATED by tools/make_text_fixtures.py --tables from Python {py} (unicodedata {ucd}) and
// ftfy {ftfy}. Do not edit: regenerate. Declarations and meaning: src/text/tables.h.
#include "text/tables.h"

namespace wan::text::tables {{
"""


def write_tables(src_dir):
    import html.entities
    import unicodedata

    import ftfy
    import ftfy.bad_codecs  # noqa: F401  (registers the sloppy codecs)
    from ftfy import chardata, badness

    head = HEADER.format(py=sys.version.split()[0], ucd=unicodedata.unidata_version, ftfy=ftfy.__version__)

    # --- HTML entities
    html5 = sorted(html.entities.html5.items(), key=lambda kv: kv[0].encode())
    upper = sorted(((k[1:], v) for k, v in chardata.HTML_ENTITIES.items() if k[1:] not in html.entities.html5),
                   key=lambda kv: kv[0].encode())
    for k, v in chardata.HTML_ENTITIES.items():  # the ftfy table = html5 names with ';' + the extras
        assert k.endswith(";") and (html.entities.html5.get(k[1:]) == v or (k[1:], v) in upper), k
    out = [head]
    out.append("const Entity kHtml5[] = {\n" + _rows(["{%s, %s}," % (_cstr(k), _cstr(v)) for k, v in html5], 4)
               + "\n};\nconst size_t kHtml5Count = sizeof(kHtml5) / sizeof(kHtml5[0]);\n\n")
    out.append("const Entity kFtfyUpper[] = {\n" + _rows(["{%s, %s}," % (_cstr(k), _cstr(v)) for k, v in upper], 4)
               + "\n};\nconst size_t kFtfyUpperCount = sizeof(kFtfyUpper) / sizeof(kFtfyUpper[0]);\n\n")
    out.append("}  // namespace wan::text::tables\n")
    with open(os.path.join(src_dir, "html_tables.cpp"), "w") as f:
        f.write("".join(out))

    # --- Unicode: canonical combining classes, canonical decompositions, decimal digits
    ccc = []
    for cp in range(0x110000):
        c = unicodedata.combining(chr(cp))
        if c:
            if ccc and ccc[-1][1] == cp - 1 and ccc[-1][2] == c:
                ccc[-1][1] = cp
            else:
                ccc.append([cp, cp, c])
    decomp = []
    for cp in range(0x110000):
        if 0xAC00 <= cp <= 0xD7A3:
            continue  # Hangul syllables: algorithmic
        d = unicodedata.decomposition(chr(cp))
        if not d or d.startswith("<"):
            continue
        parts = [int(x, 16) for x in d.split()]
        assert len(parts) in (1, 2), (cp, d)
        nfd = unicodedata.normalize("NFD", chr(cp))
        composes = len(parts) == 2 and unicodedata.normalize("NFC", nfd) == chr(cp)
        decomp.append((cp, parts[0], parts[1] if len(parts) == 2 else 0, composes))
    digits = []
    for cp in range(0x110000):
        if re.match(r"\d", chr(cp)):
            if digits and digits[-1][1] == cp - 1:
                digits[-1][1] = cp
            else:
                digits.append([cp, cp])
    out = [head]
    out.append("const CccRange kCcc[] = {\n" + _rows(["{0x%X, 0x%X, %d}," % tuple(r) for r in ccc], 6)
               + "\n};\nconst size_t kCccCount = sizeof(kCcc) / sizeof(kCcc[0]);\n\n")
    out.append("const Decomposition kDecomp[] = {\n"
               + _rows(["{0x%X, 0x%X, 0x%X, %d}," % (a, b, c, int(d)) for a, b, c, d in decomp], 5)
               + "\n};\nconst size_t kDecompCount = sizeof(kDecomp) / sizeof(kDecomp[0]);\n\n")
    out.append("const Range kDecimalDigits[] = {\n" + _rows(["{0x%X, 0x%X}," % tuple(r) for r in digits], 6)
               + "\n};\nconst size_t kDecimalDigitsCount = sizeof(kDecimalDigits) / sizeof(kDecimalDigits[0]);\n\n")

    # --- ftfy character maps
    width = sorted(chardata.WIDTH_MAP.items())
    out.append("const CodepointMap kWidthMap[] = {\n" + _rows(["{0x%X, %s}," % (k, _cstr(v)) for k, v in width], 6)
               + "\n};\nconst size_t kWidthMapCount = sizeof(kWidthMap) / sizeof(kWidthMap[0]);\n\n")
    lig = sorted(chardata.LIGATURES.items())
    out.append("const CodepointMap kLigatures[] = {\n" + _rows(["{0x%X, %s}," % (k, _cstr(v)) for k, v in lig], 6)
               + "\n};\nconst size_t kLigaturesCount = sizeof(kLigatures) / sizeof(kLigatures[0]);\n\n")
    assert sorted(chardata.CONTROL_CHARS) == sorted(
        list(range(0, 9)) + [0xB] + list(range(0xE, 0x20)) + [0x7F] + list(range(0x206A, 0x2070)) + [0xFEFF]
        + list(range(0xFFF9, 0xFFFD)))

    # --- single-byte codecs of ftfy's mojibake detection (decode tables; the byte 0x1A decodes to
    # U+FFFD in the sloppy codecs)
    assert chardata.CHARMAP_ENCODINGS == TABLE_CODECS, chardata.CHARMAP_ENCODINGS
    rows, subs = [], []
    for name in TABLE_CODECS:
        dec = bytes(range(256)).decode(name)
        assert len(dec) == 256 and len(set(dec)) == 256, name  # encoding = the inverse table
        for i in range(0x80):  # the low half is ASCII except byte 0x1A in the sloppy codecs
            assert dec[i] == chr(i) or (i == 0x1A and dec[i] == "\ufffd"), (name, i)
        subs.append("0x%X" % ord(dec[0x1A]))
        rows.append("    {  // %s, bytes 0x80..0xFF\n" % name
                    + _rows(["0x%X," % ord(c) for c in dec[0x80:]], 16).replace("    0x", "        0x") + "\n    },")
    out.append("const char32_t kCodecHigh[kCodecCount][128] = {\n" + "\n".join(rows) + "\n};\n")
    out.append("const char32_t kCodecByte1A[kCodecCount] = {" + ", ".join(subs) + "};\n\n")

    # --- ftfy badness categories and UTF-8 clues (bit per category, see tables.h)
    cats = [badness.MOJIBAKE_CATEGORIES[n] for n in (
        "common", "c1", "bad", "law", "currency", "start_punctuation", "end_punctuation", "numeric", "kaomoji",
        "upper_accented", "lower_accented", "upper_common", "lower_common", "box")]
    cats += [chardata.UTF8_CLUES[n] for n in (
        "utf8_first_of_2", "utf8_first_of_3", "utf8_first_of_4", "utf8_continuation", "utf8_continuation_strict")]
    bits = {}
    for i, chars in enumerate(cats):
        cls = re.compile("[" + chars + "]")
        for cp in range(0x110000):
            if cls.match(chr(cp)):
                bits[cp] = bits.get(cp, 0) | (1 << i)
    out.append("const CategoryBits kMojibakeCategories[] = {\n"
               + _rows(["{0x%X, 0x%X}," % kv for kv in sorted(bits.items())], 8)
               + "\n};\nconst size_t kMojibakeCategoriesCount = sizeof(kMojibakeCategories) / "
               "sizeof(kMojibakeCategories[0]);\n\n")
    words = []
    for cp in range(0x110000):
        if re.match(r"\w", chr(cp)):
            if words and words[-1][1] == cp - 1:
                words[-1][1] = cp
            else:
                words.append([cp, cp])
    out.append("const Range kWordChars[] = {\n" + _rows(["{0x%X, 0x%X}," % tuple(r) for r in words], 8)
               + "\n};\nconst size_t kWordCharsCount = sizeof(kWordChars) / sizeof(kWordChars[0]);\n\n")
    out.append("}  // namespace wan::text::tables\n")
    with open(os.path.join(src_dir, "unicode_tables.cpp"), "w") as f:
        f.write("".join(out))

    # --- grapheme cluster properties (UAX #29) for the tokenizers-library normalizer, from the
    # `regex` module (a transformers dependency). Hangul syllables (LV/LVT) are algorithmic.
    import regex

    gcb_names = ["Other", "CR", "LF", "Control", "Extend", "ZWJ", "Regional_Indicator", "Prepend", "SpacingMark",
                 "L", "V", "T"]
    incb_names = ["None", "Consonant", "Extend", "Linker"]
    gcb_re = {n: regex.compile(r"\p{Grapheme_Cluster_Break=%s}" % n) for n in gcb_names[1:]}
    incb_re = {n: regex.compile(r"\p{InCB=%s}" % n) for n in incb_names[1:]}
    ep_re = regex.compile(r"\p{Extended_Pictographic}")
    ranges = []
    for cp in range(0x110000):
        if 0xAC00 <= cp <= 0xD7A3:
            continue
        ch = chr(cp)
        g = [i + 1 for i, n in enumerate(gcb_names[1:]) if gcb_re[n].match(ch)]
        assert len(g) <= 1, (cp, g)
        ic = [i + 1 for i, n in enumerate(incb_names[1:]) if incb_re[n].match(ch)]
        key = (g[0] if g else 0, 1 if ep_re.match(ch) else 0, ic[0] if ic else 0)
        if key == (0, 0, 0):
            continue
        if ranges and ranges[-1][1] == cp - 1 and ranges[-1][2:] == list(key):
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp, *key])
    head2 = head.replace("(unicodedata", "(regex %s, unicodedata" % regex.__version__)
    with open(os.path.join(src_dir, "grapheme_tables.cpp"), "w") as f:
        f.write(head2)
        f.write("const GraphemeRange kGrapheme[] = {\n"
                + _rows(["{0x%X, 0x%X, %d, %d, %d}," % tuple(r) for r in ranges], 6)
                + "\n};\nconst size_t kGraphemeCount = sizeof(kGrapheme) / sizeof(kGrapheme[0]);\n\n")
        f.write("}  // namespace wan::text::tables\n")


# ---------------------------------------------------------------------------------------------


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--oracle", nargs=2, metavar=("IN", "OUT"))
    ap.add_argument("--umt5", metavar="DIR")
    ap.add_argument("--seed", type=int, default=20250713)
    ap.add_argument("--vocab", type=int, default=0)
    ap.add_argument("--tables", metavar="SRC_DIR", help="write the C++ tables into SRC_DIR (src/text)")
    args = ap.parse_args()

    if args.tables:
        write_tables(args.tables)
        return

    if args.oracle:
        with open(args.oracle[0], encoding="utf-8") as f:
            req = json.load(f)
        o = Oracles(req["tokenizer"], req.get("max_length", MAX_LENGTH))
        write_json(args.oracle[1], {"cases": [o.run(p, stages=True, check_spm=False) for p in req["prompts"]]})
        return

    if args.umt5:
        from safetensors.torch import save_file

        cases = build_umt5(args.umt5, args.vocab or 1600, args.seed)
        save_file(cases, os.path.join(args.umt5, "cases.safetensors"))
        return

    out = os.path.abspath(args.out)
    tok_dir = os.path.join(out, "tokenizer")
    os.makedirs(tok_dir, exist_ok=True)
    model_path = os.path.join(tok_dir, "spiece.model")
    if not os.path.exists(model_path):  # the committed model is the reference; retrain only if absent
        train_spm(model_path)
    tok = build_hf_tokenizer(model_path, tok_dir)
    o = Oracles(tok_dir, MAX_LENGTH)
    cases = [o.run(p, stages=True) for p in tokenizer_prompts()]
    write_json(os.path.join(out, "tokenizer_cases.json"),
               {"max_length": MAX_LENGTH, "vocab_size": len(tok), "cases": cases})

    from safetensors.torch import save_file

    umt5_dir = os.path.join(out, "umt5")
    umt5_cases = build_umt5(umt5_dir, len(tok), args.seed)
    save_file(umt5_cases, os.path.join(out, "umt5_cases.safetensors"))
    print("wrote", out, "vocab", len(tok))


if __name__ == "__main__":
    sys.exit(main())
