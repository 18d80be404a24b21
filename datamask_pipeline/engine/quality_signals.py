"""The heuristic quality score's signals, per language (Dagster-free): each document's language
(py3langid), the raw value of each signal, its degree on a smooth ramp at the published
filters' thresholds (:data:`THRESHOLDS`, one row per signal and language, each with its
source), and their combination into one score in [0, 1] over the signals that apply.
"""

from __future__ import annotations

import math
import unicodedata
import warnings
import zlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Signal", "Threshold", "SIGNALS", "SIGNAL_BY_NAME", "THRESHOLDS", "STOP_WORDS",
           "detect_languages", "signals", "degrees", "combine", "thresholds_markdown",
           "COMBINATIONS", "COMBINATION", "DEFAULT_SIGNALS", "MAX_CHARS", "LANGUAGE_CHARS",
           "UNKNOWN_LANGUAGE"]

# Characters of a text that are scored (bounded cost per row; the signals are fractions and
# saturate long before this, except the word count, which counts up to it).
MAX_CHARS = 100_000
# Characters of a text that the language detector reads: py3langid's accuracy on 515 man pages
# of 13 languages was 0.802 at 600 characters and 0.808 at 2,000, at 2.5x the cost (measured
# while choosing it; bench/quality.py --languages compares the detectors).
LANGUAGE_CHARS = 600
UNKNOWN_LANGUAGE = "und"

# ------------------------------------------------------------------ the published thresholds
GOPHER = "Gopher (Rae et al. 2021, App. A)"
C4 = "C4 (Raffel et al. 2020)"
FINEWEB = "FineWeb (Penedo et al. 2024; datatrove FineWebQualityFilter)"
FW2 = "FineWeb-2 configs/{}.yml"
OURS = "ours (bench/quality.py)"
# FineWeb-2's per-language configuration files (huggingface/fineweb-2, configs/), by ISO 639-1
FW2_FILES = {"de": "deu_Latn", "fr": "fra_Latn", "es": "spa_Latn", "it": "ita_Latn",
             "nl": "nld_Latn", "pt": "por_Latn", "pl": "pol_Latn", "ru": "rus_Cyrl",
             "sv": "swe_Latn", "cs": "ces_Latn", "da": "dan_Latn", "fi": "fin_Latn",
             "hu": "hun_Latn", "tr": "tur_Latn", "uk": "ukr_Cyrl", "ro": "ron_Latn",
             "id": "ind_Latn", "ja": "jpn_Jpan", "zh": "cmn_Hani", "ko": "kor_Hang"}
# Languages written without spaces between words: the word-based signals are off for a text
# mostly in their scripts (decided from the text's characters, not from the detected language)
CJK_SHARE = 0.3
_CJK = r"[\p{Han}\p{Hiragana}\p{Katakana}]"

# Stop words: Gopher's English list; FineWeb-2's per language (its configs' ``stopwords``, as
# they are: Finnish and Turkish list "the").
# For ja, zh and ko they are matched as substrings (FineWeb-2 segments those words with a
# tokenizer; whitespace does not).
STOP_WORDS = {
    "en": ("the", "be", "to", "of", "and", "that", "have", "with"),
    "de": ("der", "und", "die", "in", "von", "im", "den", "des", "mit", "das", "er", "dem",
           "als", "wurde", "für"),
    "fr": ("de", "la", "le", "et", "à", "en", "l'", "des", "du", "les", "est", "d'", "un", "une",
           "il", "dans", "par", "au"),
    "es": ("de", "la", "en", "el", "y", "a", "que", "del", "los", "se", "por", "un", "con",
           "una", "las", "su"),
    "it": ("di", "e", "il", "la", "in", "a", "del", "che", "è", "della", "un", "per", "nel",
           "l'", "con", "da", "i", "una"),
    "nl": ("de", "van", "in", "het", "een", "en", "is", "op", "voor", "met", "door", "zijn",
           "werd", "hij", "uit"),
    "pt": ("de", "a", "e", "o", "em", "do", "da", "que", "um", "no", "uma", "com", "para", "na",
           "é", "foi"),
    "pl": ("w", "i", "na", "z", "do", "się", "roku", "od", "a", "jest", "przez", "po", "jako",
           "oraz", "o", "został", "był", "nie"),
    "ru": ("в", "и", "на", "с", "года", "по", "году", "из", "был", "к", "не", "от", "что", "за",
           "для", "его", "как", "а", "он", "также", "до", "после"),
    "sv": ("i", "och", "är", "av", "en", "som", "den", "med", "på", "till", "att", "för"),
    "cs": ("v", "a", "se", "na", "je", "z", "s", "do"),
    "da": ("i", "og", "af", "en", "til", "er", "den", "at", "som", "på", "for", "med", "det",
           "blev", "var", "der", "fra", "de", "han", "et"),
    "fi": ("ja", "on", "oli", "hän", "vuonna", "myös", "joka", "se", "ei", "sen", "ovat", "sekä",
           "mutta", "että", "tai", "vuoden", "kanssa", "hänen", "s.", "jälkeen", "the"),
    "hu": ("a", "az", "és", "is", "egy", "volt", "hogy", "nem", "meg", "de", "magyar", "első",
           "el", "között"),
    "tr": ("ve", "bir", "olarak", "bu", "ile", "için", "olan", "da", "de", "tarafından",
           "yılında", "sonra", "en", "daha", "ilk", "the"),
    "uk": ("у", "в", "на", "і", "з", "та", "до", "року", "за", "що"),
    "ro": ("de", "în", "a", "și", "din", "la", "o", "cu", "este", "un", "pe", "fost", "care",
           "al"),
    "id": ("dan", "yang", "di", "pada", "dari", "ini", "dengan", "adalah", "untuk", "dalam"),
    "ja": ("の", "に", "を", "は", "た", "て", "が", "と", "で", "年", "し", "・", "月", "れ", "さ"),
    "zh": ("的", "年", "在", "月", "是", "和", "日", "了", "於", "·", "為", "有", "被", "人", "中",
           "为", "他", "與", "後", "也", "而", "由"),
    "ko": ("의", "다", "이", "는", "에", "을", "한", "년", "하", "은", "를", "했", "고", "에서", "가",
           "있", "으로", "인", "월", "로", "되"),
}
SUBSTRING_STOP_WORDS = ("ja", "zh", "ko")


@dataclass(frozen=True)
class Signal:
    """One quality signal. ``less_is_better``: the filters cap it (else they require a minimum);
    ``width``: how far past the threshold the credit falls to 0.05 (ours, when a row gives no
    ``bad``); ``log``: the ramp is on a log scale; ``words``: computed from whitespace words
    (off for a text mostly in Chinese or Japanese script); ``from_zero`` (a factor f > 0): a share
    of something bad, graded from none (credit 0.95) to f times the published cap (0.05), so
    that a page with less of it ranks higher even below the cap: f = 1 for duplicate lines (the
    cap is where the filter drops a page), f = 2 for short lines (0.5 at the cap: real man pages
    in every language sit near FineWeb's 0.67)."""

    name: str
    description: str
    less_is_better: bool
    width: float
    log: bool = False
    words: bool = False
    from_zero: float = 0.0


SIGNALS = (
    Signal("word_count", "words (whitespace-separated)", False, 0.0, log=True, words=True),
    Signal("char_count", "non-space characters, for a text in Chinese or Japanese script "
           "(where whitespace does not separate words)", False, 0.0, log=True),
    Signal("word_length_min", "mean word length (punctuation trimmed), from below", False, 1.5,
           words=True),
    Signal("word_length_max", "mean word length (punctuation trimmed), from above", True, 5.0,
           words=True),
    Signal("alpha_words", "fraction of words with an alphabetic character", False, 0.3,
           words=True),
    Signal("stop_words", "distinct stop words of the document's language", False, 2.0),
    Signal("symbol_ratio", "'#' and ellipses ('...', '…') per word", True, 0.2, words=True),
    Signal("bullet_lines", "fraction of non-empty lines starting with a bullet", True, 0.1),
    Signal("ellipsis_lines", "fraction of non-empty lines ending in an ellipsis", True, 0.3),
    Signal("punct_lines", "fraction of non-empty lines ending in terminal punctuation "
           "(. ! ? \" ' ” ’ … 。 ！ ？ and the like; not : or ))", False, 0.0),
    Signal("short_lines", "fraction of non-empty lines of at most 30 characters", True, 0.0,
           from_zero=2.0),
    Signal("dup_lines", "fraction of non-empty lines that repeat an earlier line", True, 0.0,
           from_zero=1.0),
    Signal("c4_sentences", "sentences (end marks: . ! ? and other scripts') in the distinct "
           "lines that mention neither javascript nor a policy phrase (terms of use, privacy "
           "policy, cookies); none in a page with lorem ipsum", False, 0.0, words=True),
    Signal("top_2gram", "share of the word 2-grams taken by the most frequent one", True, 0.2,
           words=True),
    Signal("dup_5gram", "fraction of word 5-grams that occur more than once", True, 0.35,
           words=True),
    Signal("word_order", "zlib size of the first 300 words over that of the same words in a "
           "fixed shuffled order (< 1: the order carries information, as in prose; ~1: "
           "shuffled words, keyword lists)", True, 0.0),
)
SIGNAL_BY_NAME = {s.name: s for s in SIGNALS}


@dataclass(frozen=True)
class Threshold:
    """One row of :data:`THRESHOLDS`: for ``signal`` in ``languages`` (ISO 639-1 codes,
    space-separated; ``*``: any other), the ``good`` value (the published threshold where there
    is one: credit 0.95 there and beyond) and the ``bad`` one (credit 0.05; default ``good``
    -/+ the signal's width); ``good`` None: the signal does not apply there."""

    signal: str
    languages: str
    good: float | None
    source: str
    bad: float | None = None


def _fw2(signal, key, transform=lambda v: v) -> tuple:
    """One row per FineWeb-2 language for ``signal`` from its config value ``key``."""
    return tuple(Threshold(signal, lang, transform(v), FW2.format(FW2_FILES[lang]))
                 for lang, v in _FW2_VALUES[key].items())


# FineWeb-2's values for the languages above (configs/<file>.yml): line_punct_thr,
# dup_line_frac, top_n_grams[2], dup_n_grams[5], max_non_alpha_words_ratio (the share of words
# with a letter it requires), min/max_avg_word_length
_FW2_VALUES = {
    "line_punct_thr": {"de": 0.0, "fr": 0.1, "es": 0.182, "it": 0.025, "nl": 0.102,
                       "pt": 0.077, "pl": 0.087, "ru": 0.231, "sv": 0.2, "cs": 0.06, "da": 0.1,
                       "fi": 0.114, "hu": 0.067, "tr": 0.091, "uk": 0.167, "ro": 0.081,
                       "id": 0.111, "ja": 0.096, "zh": 0.106, "ko": 0.062},
    "dup_line_frac": {"de": 0.263, "fr": 0.264, "es": 0.252, "it": 0.246, "nl": 0.296,
                      "pt": 0.287, "pl": 0.32, "ru": 0.322, "sv": 0.292, "cs": 0.311,
                      "da": 0.305, "fi": 0.293, "hu": 0.322, "tr": 0.272, "uk": 0.3,
                      "ro": 0.289, "id": 0.241, "ja": 0.328, "zh": 0.287, "ko": 0.374},
    "top_2gram": {"de": 0.169, "fr": 0.161, "es": 0.156, "it": 0.198, "nl": 0.213,
                  "pt": 0.371, "pl": 0.222, "ru": 0.184, "sv": 0.242, "cs": 0.206, "da": 0.367,
                  "fi": 0.253, "hu": 0.226, "tr": 0.214, "uk": 0.189, "ro": 0.161, "id": 0.194,
                  "ko": 0.282},
    "dup_5gram": {"de": 0.141, "fr": 0.15, "es": 0.145, "it": 0.144, "nl": 0.156, "pt": 0.163,
                  "pl": 0.172, "ru": 0.168, "sv": 0.156, "cs": 0.168, "da": 0.169, "fi": 0.153,
                  "hu": 0.169, "tr": 0.154, "uk": 0.16, "ro": 0.16, "id": 0.166, "ko": 0.201},
    "alpha_words": {"de": 0.774, "fr": 0.812, "es": 0.825, "it": 0.807, "nl": 0.828,
                    "pt": 0.814, "pl": 0.726, "ru": 0.713, "sv": 0.841, "cs": 0.781,
                    "da": 0.798, "fi": 0.755, "hu": 0.766, "tr": 0.773, "uk": 0.694,
                    "ro": 0.779, "id": 0.805, "ko": 0.791},
    "min_avg_word_length": {"de": 0, "fr": 2, "es": 3, "it": 3, "nl": 3, "pt": 3, "pl": 3,
                            "ru": 3, "sv": 3, "cs": 3, "da": 3, "fi": 3, "hu": 3, "tr": 3,
                            "uk": 3, "ro": 1, "id": 3, "ko": 1},
    "max_avg_word_length": {"de": 15, "fr": 11, "es": 14, "it": 21, "nl": 17, "pt": 13,
                            "pl": 12, "ru": 11, "sv": 12, "cs": 11, "da": 11, "fi": 14,
                            "hu": 15, "tr": 21, "uk": 11, "ro": 14, "id": 12, "ko": 6},
}
_FW2_LANGS = " ".join(FW2_FILES)

# THE table: every threshold of the heuristic score, with its source. docs/quality.md renders
# it (thresholds_markdown; tests/engine/test_docs.py re-renders and compares).
THRESHOLDS = (
    Threshold("word_count", "*", 50, GOPHER + ": 50 <= words <= 100,000", bad=10),
    Threshold("char_count", "*", 100, OURS + ": about 50 words of Chinese or Japanese", bad=20),
    Threshold("word_length_min", "*", 3, GOPHER + ": mean word length >= 3"),
    *_fw2("word_length_min", "min_avg_word_length", lambda v: v if v > 0 else None),
    Threshold("word_length_max", "*", 10, GOPHER + ": mean word length <= 10"),
    *_fw2("word_length_max", "max_avg_word_length"),
    Threshold("alpha_words", "*", 0.8, GOPHER + ": >= 80% of words have a letter"),
    *_fw2("alpha_words", "alpha_words"),
    Threshold("stop_words", "*", None, "no stop-word list for the language: off"),
    Threshold("stop_words", "en", 2, GOPHER + ": >= 2 of its 8 stop words", bad=0),
    *(Threshold("stop_words", lang, 2, GOPHER + ": >= 2; the words: " + FW2.format(f), bad=0)
      for lang, f in FW2_FILES.items()),
    Threshold("symbol_ratio", "*", 0.1, GOPHER + ": <= 0.1 '#' or ellipsis per word"),
    Threshold("bullet_lines", "*", 0.9, GOPHER + ": <= 90% of lines start with a bullet"),
    Threshold("ellipsis_lines", "*", 0.3, GOPHER + ": <= 30% of lines end in an ellipsis"),
    Threshold("punct_lines", "*", 0.12, FINEWEB + ": >= 12% of lines end in terminal "
              "punctuation (" + C4 + " keeps only such lines)", bad=0.0),
    *(Threshold("punct_lines", lang, v if v > 0 else None, FW2.format(FW2_FILES[lang])
                + ("" if v > 0 else ": 0, off"), bad=0.0 if v > 0 else None)
      for lang, v in _FW2_VALUES["line_punct_thr"].items()),
    Threshold("short_lines", "*", 0.67, FINEWEB + ": <= 67% of lines of <= 30 characters "
              "(FineWeb-2 turns it off; kept here in every language: it is what separates "
              "a page with boilerplate lines mixed in)"),
    Threshold("dup_lines", "*", 0.3, GOPHER + ": <= 30% duplicate lines (dup_line_frac)"),
    Threshold("c4_sentences", "*", 3, C4 + ": >= 3 sentences, counted by end marks, in the "
              "lines kept (without javascript or a policy phrase; a repeated line once, as its "
              "deduplication keeps one copy). C4 also keeps only lines of >= 5 words ending in "
              "punctuation, which drops the sentences of hard-wrapped text: here short_lines "
              "and punct_lines measure those", bad=1),
    *_fw2("dup_lines", "dup_line_frac"),
    Threshold("top_2gram", "*", 0.2, GOPHER + ": <= 20% (of characters; here of 2-grams)"),
    *_fw2("top_2gram", "top_2gram"),
    Threshold("dup_5gram", "*", 0.15, GOPHER + ": <= 15% (of characters; here of 5-grams)"),
    *_fw2("dup_5gram", "dup_5gram"),
    Threshold("word_order", "*", 0.97, OURS + ": real man pages 0.84-0.99, shuffled ~1.0 "
              "(at least 20 words, else off)", bad=0.995),
)


@lru_cache(maxsize=None)
def _ramp_table(languages: tuple) -> dict:
    """{signal: (bad (L,), good (L,))} for the given languages (NaN: not applicable)."""
    out = {}
    for s in SIGNALS:
        rows = [t for t in THRESHOLDS if t.signal == s.name]
        default = next(t for t in rows if t.languages == "*")
        bad, good = np.full(len(languages), np.nan), np.full(len(languages), np.nan)
        for i, lang in enumerate(languages):
            row = next((t for t in rows if lang in t.languages.split()), default)
            if row.good is None:
                continue
            bad[i], good[i] = _ramp(s, row)
            if s.log:
                bad[i], good[i] = math.log(bad[i]), math.log(good[i])
        out[s.name] = (bad, good)
    return out


def _ramp(s: Signal, t: Threshold) -> tuple[float, float]:
    """(credit 0.05, credit 0.95) values of signal ``s`` under row ``t``."""
    if s.from_zero:
        return s.from_zero * float(t.good), 0.0
    g = float(t.good)
    if t.bad is not None:
        return float(t.bad), g
    return (g + s.width if s.less_is_better else g - s.width), g


# ------------------------------------------------------------------ language
LANGUAGE_BYTES = 1024  # and at most this many UTF-8 bytes of them
_LANGID_CHUNK = 2048  # texts walked at once (the walk holds (chunk, LANGUAGE_BYTES) int32)


class _LanguageIdentifier:
    """py3langid's model (its wheel ships it; nothing is downloaded) applied to a batch at once:
    the same byte-DFA walk and naive-Bayes sum as ``py3langid.classify`` (equal labels,
    tests/engine/test_quality.py), stepped over all texts together by byte position, with the
    feature counts summed by a sparse product instead of text by text in Python."""

    def __init__(self):
        import py3langid.langid as langid

        m = langid.LanguageIdentifier.from_model_file(langid.MODEL_FILE)
        self.model = m
        dtype = {2: np.uint16, 4: np.uint32, 8: np.uint64}[m.tk_nextmove.itemsize]
        self.nextmove = np.frombuffer(m.tk_nextmove, dtype).astype(np.int32)
        self.rowbase = np.asarray(m.tk_row, np.int32) << 8
        self.output = np.asarray(m.tk_output, np.int32)  # feature emitted per state, -1: none
        self.ptc = np.asarray(m.nb_ptc, np.float32)  # (features, classes)
        self.pc = np.asarray(m.nb_pc, np.float32)
        self.classes = np.asarray(m.nb_classes, object)
        self.alias = list(m._alias_pairs)  # (first, dupe) columns of one label

    @staticmethod
    def encode(text: str) -> bytes:
        """The bytes of ``text`` the detector reads (py3langid's own normalisation)."""
        t = text[:LANGUAGE_CHARS]
        if t.isupper():
            t = t.lower()
        b = unicodedata.normalize("NFC", t).encode("utf-8", "surrogatepass")
        if len(b) > LANGUAGE_BYTES:  # whole characters only
            b = b[:LANGUAGE_BYTES].decode("utf-8", "ignore").encode("utf-8")
        return b

    def classify(self, texts: list) -> np.ndarray:
        import torch

        out = np.empty(len(texts), object)
        for s in range(0, len(texts), _LANGID_CHUNK):
            out[s:s + _LANGID_CHUNK] = self._chunk(texts[s:s + _LANGID_CHUNK], torch)
        return out

    def _chunk(self, texts: list, torch) -> np.ndarray:
        data = [self.encode(t) for t in texts]
        n = len(data)
        lens = np.fromiter(map(len, data), np.int64, n)
        width = int(lens.max(initial=0))
        buf = np.zeros((width, n), np.int32)  # (width, n) bytes by position, 0-padded
        flat = np.frombuffer(b"".join(data), np.uint8)
        col = np.repeat(np.arange(n), lens)
        buf[np.arange(len(flat)) - np.repeat(np.cumsum(lens) - lens, lens), col] = flat
        state = np.zeros(n, np.int32)
        feats = np.empty((width, n), np.int32)  # (width, n) feature per byte, -1: none
        for p in range(width):
            state = self.nextmove[self.rowbase[state] + buf[p]]
            feats[p] = self.output[state]
        feats = feats.T.copy()  # (n, width)
        feats[np.arange(width)[None, :] >= lens[:, None]] = -1  # the padding's walk
        feats.sort(axis=1)
        n_feat = self.ptc.shape[0]
        key = (np.arange(n, dtype=np.int64)[:, None] * n_feat + feats)[feats >= 0]  # sorted
        start = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if len(key) else key
        count = np.diff(np.r_[start, len(key)]).astype(np.float32)
        doc, feat = key[start] // n_feat, key[start] % n_feat
        crow = np.searchsorted(doc, np.arange(n + 1))
        with warnings.catch_warnings():  # "sparse CSR support is in beta"
            warnings.simplefilter("ignore", UserWarning)
            m = torch.sparse_csr_tensor(torch.from_numpy(crow), torch.from_numpy(feat),
                                        torch.from_numpy(np.log1p(count)), (n, n_feat))
        scores = (m @ torch.from_numpy(self.ptc)).numpy() + self.pc  # (n, classes)
        for i, j in self.alias:
            scores[:, i] = np.maximum(scores[:, i], scores[:, j])
            scores[:, j] = -np.inf
        labels = self.classes[scores.argmax(axis=1)]
        labels[np.bincount(doc, minlength=n) == 0] = UNKNOWN_LANGUAGE  # no feature at all
        return labels


@lru_cache(maxsize=1)
def _identifier() -> _LanguageIdentifier:
    return _LanguageIdentifier()


def detect_languages(texts) -> np.ndarray:
    """Each text's language (ISO 639-1, among py3langid's 97; ``und`` for a text in which the
    model finds no feature), from its first :data:`LANGUAGE_CHARS` characters (at most
    :data:`LANGUAGE_BYTES` bytes). (n,) object array."""
    return _identifier().classify(list(texts))


# ------------------------------------------------------------------ raw values
BULLETS = r"^\s*([-*•‣◦▪●·–—>]|\d+[.)])\s"
# punctuation stripped from a word's ends before its length and stop-word test
_PUNCT = "\"'()[]{}<>.,;:!?`*_-–—…«»“”‘’/\\|#"
# terminal punctuation (C4: . ? ! "; FineWeb's TERMINAL_PUNCTUATION adds other scripts')
TERMINAL = r"[.!?\"'”’»…。！？｡؟۔।॥።]$"
# C4's page rule (Raffel et al. 2020; tensorflow_datasets c4_utils.clean_page): a page keeps
# >= 3 sentences, counted by end marks, in the lines it keeps, lines that mention neither
# javascript nor a policy phrase ("lorem ipsum" drops the page). C4 keeps only lines of >= 5
# words ending in punctuation too; not here: the last line of a hard-wrapped paragraph is short
# and its other lines end mid-sentence, so real wrapped text would keep no sentence (on the
# Python reference manual's paragraphs, a tenth of the documents scored under 0.2)
C4_DROP_LINE = ("javascript|terms of use|privacy policy|cookie policy|uses cookies|"
                "use of cookies|use cookies")
# a sentence's end: one '.' (not an ellipsis) or a run of ! ? and other scripts' end marks,
# then closing quotes or brackets, then a space or the line's end
C4_END = r"(^|[^.])(\.|[!?。！？｡؟۔।॥።]+)[\"'”’“‘»«)\]]*(\s|$)"
WORD_ORDER_WORDS = 300
WORD_ORDER_MIN_WORDS = 20


def _as_text(texts) -> pa.Array:
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    if not isinstance(texts, pa.Array):
        texts = pa.array(list(texts), pa.large_string())
    if not pa.types.is_large_string(texts.type):
        texts = texts.cast(pa.large_string())
    return pc.fill_null(texts, "")


def _np(a, dtype=np.float64) -> np.ndarray:
    return np.asarray(a.to_numpy(zero_copy_only=False), dtype)


def _per_doc(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sums of ``values`` between consecutive ``offsets`` (one per document, 0 when empty)."""
    csum = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    return csum[offsets[1:]] - csum[offsets[:-1]]


def _offsets(lists: pa.Array) -> np.ndarray:
    return np.asarray(lists.offsets.to_numpy(zero_copy_only=False), np.int64) - int(
        lists.offsets[0].as_py())


def _ratio(num, den, empty=0.0) -> np.ndarray:
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    return np.where(den > 0, num / np.maximum(den, 1), empty)


def _codes(values: pa.Array) -> np.ndarray:
    """One int64 code per value, equal for equal values."""
    return _np(pc.dictionary_encode(values).indices, np.int64)


def _repeat_fractions(doc: np.ndarray, codes: np.ndarray, n: int,
                      n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """For word n-grams inside each document: (fraction of n-gram positions whose n-gram occurs
    more than once in the document, share of the most frequent n-gram)."""
    m = len(codes)
    if m < n:  # a text of fewer than n words has no n-gram: both fractions are 1 (fails)
        return np.ones(n_docs), np.ones(n_docs)
    pos = np.arange(m - n + 1)
    pos = pos[doc[pos] == doc[pos + n - 1]]  # the n-gram does not cross a document boundary
    if not len(pos):
        return np.ones(n_docs), np.ones(n_docs)
    h = np.zeros(len(pos), np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * np.uint64(1_000_003) + codes[pos + j].astype(np.uint64)
        h = h * np.uint64(2_654_435_761) + doc[pos].astype(np.uint64)
    _, inv, counts = np.unique(h, return_inverse=True, return_counts=True)
    d = doc[pos]
    total = np.bincount(d, minlength=n_docs)
    dup = np.bincount(d, weights=(counts[inv] > 1), minlength=n_docs)
    top = np.zeros(n_docs)
    np.maximum.at(top, d, counts[inv].astype(np.float64))
    return _ratio(dup, total, empty=1.0), _ratio(top, total, empty=1.0)


@lru_cache(maxsize=512)
def _shuffle(n: int) -> np.ndarray:
    """A fixed pseudo-random order of n positions (the same for every text of n words, so a
    text's score does not depend on its batch)."""
    x = (np.arange(n, dtype=np.uint64) * np.uint64(2_654_435_761)) % np.uint64(4_294_967_291)
    return np.argsort(x, kind="stable")


def _word_order(texts: list) -> np.ndarray:
    """zlib size of each text's first WORD_ORDER_WORDS words over that of the same words
    shuffled (NaN under WORD_ORDER_MIN_WORDS words)."""
    out = np.full(len(texts), np.nan)
    for i, t in enumerate(texts):
        w = t[:WORD_ORDER_WORDS * 16].split()[:WORD_ORDER_WORDS]
        if len(w) < WORD_ORDER_MIN_WORDS:
            continue
        a = " ".join(w).encode("utf-8", "surrogatepass")
        b = " ".join([w[j] for j in _shuffle(len(w))]).encode("utf-8", "surrogatepass")
        out[i] = len(zlib.compress(a, 6)) / len(zlib.compress(b, 6))
    return out


_WORD_LISTS = tuple(lang for lang in STOP_WORDS if lang not in SUBSTRING_STOP_WORDS)


def _stop_words(words: pa.Array, doc: np.ndarray, text: pa.Array, languages: np.ndarray,
                n: int) -> np.ndarray:
    """Distinct stop words of each document's language in it (NaN: no list). ``words``: the
    lower-cased, trimmed words of all documents, ``doc``: each word's document."""
    out = np.full(n, np.nan)
    lang = languages.astype(str)
    has = np.isin(lang, list(STOP_WORDS))
    out[has] = 0.0
    if len(doc):  # whitespace words: is each distinct word on its document's language's list
        enc = pc.dictionary_encode(words)
        codes = _np(enc.indices, np.int64)
        member = np.zeros((len(_WORD_LISTS) + 1, len(enc.dictionary)), bool)  # last: no list
        for i, code in enumerate(_WORD_LISTS):
            if (lang == code).any():
                member[i] = _np(pc.is_in(enc.dictionary, pa.array(STOP_WORDS[code])), bool)
        index = {code: i for i, code in enumerate(_WORD_LISTS)}
        lang_row = np.array([index.get(x, len(_WORD_LISTS)) for x in lang], np.int64)
        hit = member[lang_row[doc], codes]
        base = len(enc.dictionary) + 1
        distinct = np.unique(doc[hit].astype(np.int64) * base + codes[hit])
        count = np.bincount(distinct // base, minlength=n).astype(np.float64)
        words_list = np.isin(lang, _WORD_LISTS)
        out[words_list] = count[words_list]
    for code in set(lang.tolist()) & set(SUBSTRING_STOP_WORDS):
        rows = np.flatnonzero(lang == code)  # characters: substrings
        sub = text.take(pa.array(rows))
        out[rows] = sum((_np(pc.count_substring(sub, w)) > 0).astype(np.float64)
                        for w in STOP_WORDS[code])
    return out


def signals(texts, languages=None) -> dict:
    """The raw value of every signal in :data:`SIGNALS` for each text, vectorised over the
    batch (pyarrow.compute and numpy; the language detector and the word-order compression go
    text by text). ``languages``: each text's (default: :func:`detect_languages`). Returns
    ``{name: float64 (n,)}``, NaN where the signal does not apply to the text (the word
    signals on Chinese or Japanese script, the character count elsewhere, stop words without a
    list, word order under 20 words). A text is read up to :data:`MAX_CHARS` characters."""
    text = _as_text(texts)
    n = len(text)
    text = pc.utf8_slice_codeunits(text, 0, MAX_CHARS)
    py = text.to_pylist()
    languages = detect_languages(py) if languages is None else np.asarray(languages, object)
    out = {}
    # script: Chinese / Japanese characters among the non-space ones
    words_l = pc.utf8_split_whitespace(text)
    w_off = _offsets(words_l)
    words = pc.list_flatten(words_l)
    n_words = np.diff(w_off).astype(np.float64)
    doc = np.repeat(np.arange(n), np.diff(w_off))
    nonspace = _per_doc(w_off, _np(pc.utf8_length(words)))
    cjk = _ratio(_np(pc.count_substring_regex(text, _CJK)), nonspace) > CJK_SHARE
    out["word_count"] = n_words
    out["char_count"] = nonspace
    trimmed = pc.utf8_trim(words, _PUNCT)
    lengths = _np(pc.utf8_length(trimmed))
    mwl = np.where(n_words > 0, _ratio(_per_doc(w_off, lengths), n_words), 0.0)
    out["word_length_min"] = out["word_length_max"] = mwl
    alpha = _np(pc.match_substring_regex(words, r"\pL"))
    out["alpha_words"] = _ratio(_per_doc(w_off, alpha), n_words)
    lower = pc.utf8_lower(trimmed)
    codes = _codes(lower)
    out["stop_words"] = _stop_words(lower, doc, text, languages, n)
    n_sym = (_np(pc.count_substring(text, "#")) + _np(pc.count_substring(text, "..."))
             + _np(pc.count_substring(text, "…")))
    out["symbol_ratio"] = _ratio(n_sym, n_words, empty=1.0)
    _, top2 = _repeat_fractions(doc, codes, 2, n)
    dup5, _ = _repeat_fractions(doc, codes, 5, n)
    out["top_2gram"], out["dup_5gram"] = top2, dup5
    # lines
    lines_l = pc.split_pattern(text, "\n")
    l_off = _offsets(lines_l)
    lines = pc.utf8_trim_whitespace(pc.list_flatten(lines_l))
    nonempty = _np(pc.greater(pc.utf8_length(lines), 0), bool)
    n_lines = _per_doc(l_off, nonempty.astype(np.float64))

    def line_frac(mask) -> np.ndarray:
        m = _np(pc.fill_null(mask, False), bool) & nonempty
        return _ratio(_per_doc(l_off, m.astype(np.float64)), n_lines)

    out["bullet_lines"] = line_frac(pc.match_substring_regex(lines, BULLETS))
    out["ellipsis_lines"] = line_frac(pc.or_(pc.ends_with(lines, "..."),
                                             pc.ends_with(lines, "…")))
    out["punct_lines"] = line_frac(pc.match_substring_regex(lines, TERMINAL))
    out["short_lines"] = line_frac(pc.less_equal(pc.utf8_length(lines), 30))
    line_doc = np.repeat(np.arange(n), np.diff(l_off))
    lc = _codes(lines)
    key = (line_doc.astype(np.int64) * (int(lc.max(initial=0)) + 1) + lc)[nonempty]
    first = np.zeros(len(key), bool)
    if len(key):
        first[np.unique(key, return_index=True)[1]] = True
    repeat = np.zeros(len(nonempty), np.float64)
    repeat[np.flatnonzero(nonempty)] = ~first
    out["dup_lines"] = _ratio(_per_doc(l_off, repeat), n_lines)
    # C4's sentences: end marks in the distinct lines without javascript or a policy phrase;
    # none in a page with lorem ipsum
    lower_lines = pc.utf8_lower(lines)
    kept = nonempty & (repeat == 0) & ~_np(
        pc.match_substring_regex(lower_lines, C4_DROP_LINE), bool)
    ends = _np(pc.count_substring_regex(lines, C4_END))
    lorem = _np(pc.count_substring(text, "lorem ipsum", ignore_case=True)) > 0
    out["c4_sentences"] = np.where(lorem, 0.0, _per_doc(l_off, np.where(kept, ends, 0.0)))
    out["word_order"] = _word_order(py)
    # what does not apply: word signals on Chinese/Japanese script, characters elsewhere
    for s in SIGNALS:
        if s.words:
            out[s.name] = np.where(cjk, np.nan, out[s.name])
    out["char_count"] = np.where(cjk, out["char_count"], np.nan)
    return out


# ------------------------------------------------------------------ degrees and the score
_Z = math.log(19.0)  # logistic(±_Z) = 0.95 / 0.05


def degrees(values: dict, languages) -> dict:
    """Each signal's degree in (0, 1): a logistic ramp through 0.05 at the language's ``bad``
    value and 0.95 at its ``good`` one (:data:`THRESHOLDS`; on a log scale for the counts),
    NaN where the signal does not apply (to the text, or to its language)."""
    languages = np.asarray(languages, object)
    uniq, inv = np.unique(languages.astype(str), return_inverse=True)
    table = _ramp_table(tuple(uniq.tolist()))
    out = {}
    for s in SIGNALS:
        x = np.asarray(values[s.name], np.float64)
        if s.log:
            x = np.log(np.maximum(x, 1.0))
        bad, good = (v[inv] for v in table[s.name])
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            z = -_Z + 2 * _Z * (x - bad) / (good - bad)
            out[s.name] = 1.0 / (1.0 + np.exp(-z))
    return out


# How the degrees become one score. Measured in bench/quality.py (per language and per kind of
# damage, and through the selection: python -m bench.quality --main-job 100). The selection
# weighs the score's size, not only its order: under the arithmetic or geometric mean a page
# that fails one or two signals still scores ~0.8, cheap for a diversity term that likes
# outliers; the power mean with exponent -2 weighs a failing signal more (between the harmonic
# mean and the minimum) and kept damaged pages out of pair-wise similarity's selection.
COMBINATIONS = ("mean", "geomean", "harmonic", "power-2", "min")
COMBINATION = "power-2"
DEFAULT_SIGNALS = tuple(s.name for s in SIGNALS)
_EPS = 0.02  # the floor of a degree inside the geometric and power means (no 0 or -inf)
_POWER = {"harmonic": -1.0, "power-2": -2.0}


def combine(deg: dict, how: str = COMBINATION, names=None) -> np.ndarray:
    """One score in [0, 1] per text over the signals that apply to it (a NaN degree is left out
    and costs nothing), of ``names`` (default :data:`DEFAULT_SIGNALS`): ``mean``, the
    arithmetic mean; ``geomean``, the geometric mean; ``harmonic`` and ``power-2``, the power
    means with exponent -1 and -2 (the default: a failing signal pulls the score down instead of
    being averaged away); these three floor each degree at 0.02 and rescale so that 0.02 maps to
    0; ``min``, the weakest signal (as a filter that needs every rule to pass). A text to which
    no signal applies scores 0."""
    names = list(names or DEFAULT_SIGNALS)
    x = np.stack([np.asarray(deg[k], np.float64) for k in names])  # (signals, n)
    ok = ~np.isnan(x)
    m = ok.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        if how == "mean":
            s = np.where(ok, x, 0.0).sum(axis=0) / m
        elif how == "geomean":
            g = np.exp(np.where(ok, np.log(np.maximum(x, _EPS)), 0.0).sum(axis=0) / m)
            s = (g - _EPS) / (1 - _EPS)
        elif how in _POWER:
            p = _POWER[how]
            g = (np.where(ok, np.maximum(x, _EPS) ** p, 0.0).sum(axis=0) / m) ** (1.0 / p)
            s = (g - _EPS) / (1 - _EPS)
        elif how == "min":
            s = np.where(ok, x, np.inf).min(axis=0)
        else:
            raise ValueError(f"combination must be one of {COMBINATIONS}, got {how!r}")
    return np.clip(np.where(m > 0, s, 0.0), 0.0, 1.0)


def _credit(s: Signal, t: Threshold) -> tuple[str, str]:
    """(credit 0.95 at, credit 0.05 at) of one row, as the docs show them."""
    if t.good is None:
        return "off", "off"
    bad, good = _ramp(s, t)
    rel = "≤" if s.less_is_better else "≥"
    if s.from_zero:
        return "0", f"≥ {round(bad, 6):g}" + (" (the cap)" if s.from_zero == 1.0 else
                                              f" ({s.from_zero:g}× the cap)")
    return f"{rel} {good:g}", f"{'≥' if s.less_is_better else '≤'} {round(bad, 6):g}"


def thresholds_markdown() -> str:
    """:data:`THRESHOLDS` as docs/quality.md shows them: the rows for any language, then the
    per-language rows (FineWeb-2's values) as one table with a column per signal."""
    lines = ["| signal | what it measures | credit 0.95 at | credit 0.05 at | source |",
             "|---|---|---|---|---|"]
    per_lang: dict = {}
    for t in THRESHOLDS:
        s = SIGNAL_BY_NAME[t.signal]
        if t.languages == "*" or t.languages == "en":
            good, bad = _credit(s, t)
            what = s.description + (" (English)" if t.languages == "en" else "")
            lines.append(f"| `{t.signal}` | {what} | {good} | {bad} | {t.source} |")
        else:
            for lang in t.languages.split():
                per_lang.setdefault(lang, {})[t.signal] = t
    cols = [s.name for s in SIGNALS if any(s.name in v for v in per_lang.values())]
    lines += ["", "Per language (credit 0.95 at; the other end as above; off: the signal does "
              "not apply), from FineWeb-2's configuration file for the language "
              "(`configs/<file>.yml` in huggingface/fineweb-2), and its stop words:", "",
              "| language | file | " + " | ".join(f"`{c}`" for c in cols) + " | stop words |",
              "|---|---|" + "---:|" * len(cols) + "---|"]
    for lang, rows in per_lang.items():
        cells = [_credit(SIGNAL_BY_NAME[c], rows[c])[0] if c in rows else "as above"
                 for c in cols]
        words = " ".join(STOP_WORDS.get(lang, ()))
        lines.append(f"| {lang} | {FW2_FILES.get(lang, '')} | " + " | ".join(cells)
                     + f" | {words} |")
    return "\n".join(lines)
