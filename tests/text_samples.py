"""Seeded text generators for tokenizer tests: many small strings aimed at the corners of GPT-2's word splitting and
byte-level BPE, and a few large texts. The same seed gives the same strings, so a failure reproduces."""
import ast
import random
import textwrap
import unicodedata
from pathlib import Path

from pydoc_data.topics import topics  # the language reference's prose, shipped with CPython

WORDS = (
    "the of and to in is was that for it with as his on be at by this had not are but from or have an they which one "
    "you were her all she there would their we him been has when who will more no if out so said what up its about "
    "into than them can only other new some could time these two may then do first any my now such like our over man "
    "me even most made after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men work long get here "
    "between both life being under never day same another know while last might us great old year off come since "
    "against go came right used take three tokenizer numpy transformer attention layer embedding gradient"
).split()
CONTRACTIONS = ("'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D", "'", "''")
PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~" + "…—–«»¿¡“”‘’„•·§¶†‡°±×÷€£¥©®™"
SPACES = (" ", "  ", "\t", "\n", "\n\n", "\r\n", "\r", "\u00a0", "\u3000", "\u2009", "\u200b", "\v", "\f", " \t ")
EMOJI = (
    "😀", "👍", "👍🏽", "🎉", "🤖", "❤️", "🇺🇸", "🇯🇵", "1️⃣", "👨‍👩‍👧‍👦", "👩🏾‍💻", "🏳️‍🌈", "🧑‍🤝‍🧑", "😂😂😂", "☕",
    "✨", "🦀", "🐍",
)
CJK = ("中文", "我爱自然语言处理", "日本語のテキスト", "ひらがな", "カタカナ", "한국어", "안녕하세요", "漢字",
       "。", "、", "！", "「」")
ACCENTED = ("e\u0301", "a\u0300", "n\u0303", "o\u0308", "c\u0327", "café", "naïve", "Ångström", "Zoë", "u\u0308\u0301",
            "Z\u0351\u0352\u0353\u0354", "ﬁ", "Ǆ", "ß", "İ", "Ω")
RTL = ("שלום", "עולם", "مرحبا", "بالعالم", "العربية", "١٢٣", "۴۵۶", "\u200f", "\u200e", "\u202b", "\u202c", "ܐܒܓ")
CODE = (
    "def f(x):\n    return x ** 2\n",
    "for (let i = 0; i < n; i++) { sum += a[i]; }",
    "if __name__ == '__main__':\n\tmain()\n",
    "x = np.einsum('hqd,hkd->hqk', q, k) / np.sqrt(d)",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }",
    "SELECT * FROM users WHERE id >= 10 AND name != 'x';",
    "<div class=\"a\">&nbsp;</div>",
    "    // TODO: fix\n        return;\n",
    "{\"key\": [1, 2.5, -3e10, null, true]}",
    "a+=1;b-=2;c*=3;d/=4;e%=5;f**=6;g//=7",
    "<|endoftext|>",
    "<|endoftext|> after",
)


# characters GPT-2's regex keeps in one word however long the run: letters (\p{L}+), digits (\p{N}+), other symbols
LONG_WORD_ALPHABETS = {
    "letters": "abcdefghijklmnopqrstuvwxyz",
    "digits": "0123456789",
    "CJK": "".join(map(chr, range(0x4E00, 0x9FA6))),  # the ideographs of Unicode 1.1, assigned in every regex release
    "punctuation": PUNCTUATION,
    "mixed scripts": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZéèêëàâäçñößøåæœαβγδεζηθικλμνξοπρστυφχψω"
    "абвгдежзийклмнопрстуфхцчшщъыьэюяאבגדהוזחטיכלמנסעפצקרשתابتثجحخدذرزسشصضطظعغفقكلمنهويあいうえおかきくけこアイウエオ"
    "한국어안녕하세요中文字漢語",
}


def long_word(kind, n_bytes, seed=0):  # -> random characters of one LONG_WORD_ALPHABETS kind, at most n_bytes in UTF-8
    text = "".join(random.Random(seed).choices(LONG_WORD_ALPHABETS[kind], k=n_bytes))
    return text.encode("utf-8")[:n_bytes].decode("utf-8", errors="ignore")  # drops a character cut at the end


# a few characters each (spaces, a newline, an accent, an emoji, a digit): texts over them hold many pairs with equal
# counts, so BPE training's tie rule decides most merges, and runs such as "aaaa" where pairs overlap
FEW_LETTER_ALPHABETS = ("ab", "abc", "ab ", "a b", "xyz  ", "aab", "é ", "😀a ", "a\n b", "1 2", "aA' ")


def few_letter_text(rng, most=300):  # -> up to `most` characters drawn from one of FEW_LETTER_ALPHABETS
    alphabet = rng.choice(FEW_LETTER_ALPHABETS)
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, most)))


def sample_strings(count, seed=0):  # -> list of `count` strings, cycling through the kinds below
    rng = random.Random(seed)
    kinds = [prose, contractions, numbers, punctuation, whitespace, emoji, cjk, accents, rtl, code, unicode_soup, mixed]
    return [kinds[n % len(kinds)](rng) for n in range(count)]


def pieces(rng, make_piece, most, glue=""):  # -> 1 to `most` pieces from make_piece(), joined by glue
    return glue.join(make_piece() for _ in range(rng.randint(1, most)))


def prose(rng):
    def word():
        word = rng.choice(WORDS)
        case = rng.choices([str, str.capitalize, str.upper], weights=[80, 15, 5])[0]
        return case(word) + rng.choices(["", ",", ".", ";", ":", "!", "?"], weights=[90, 2, 2, 1, 1, 1, 1])[0]
    return pieces(rng, word, 30, " ")


def contractions(rng):
    def contraction():
        return rng.choice(WORDS + ["I", "YOU", "They", "it", ""]) + rng.choice(CONTRACTIONS)
    return pieces(rng, contraction, 8, rng.choice([" ", "", "  ", "\n"]))


def numbers(rng):
    def number():
        digits = "".join(rng.choice("0123456789") for _ in range(rng.choice([1, 2, 3, 4, 7, 9, 16, 25, 40])))
        forms = [digits, f"{digits}.{digits[:3]}", f"{int(digits):,}", f"-{digits}", "0" * len(digits), f"{digits}%"]
        return rng.choice(forms)
    return pieces(rng, number, 6, rng.choice([" ", "", ", ", "x", " and "]))


def punctuation(rng):
    return pieces(rng, lambda: rng.choice(PUNCTUATION) * rng.randint(1, 4) + rng.choice(["", " ", "a", "1"]), 10)


def whitespace(rng):
    # runs of mixed whitespace between, before and after words exercise `\s+(?!\S)` and `\s+`
    def spaced_word():
        return rng.choice(SPACES) * rng.randint(1, 5) + rng.choice(WORDS + ["", "", "1", "."])
    return pieces(rng, spaced_word, 8) + rng.choice(["", " ", "  ", "\n", "\t", " \n "])


def emoji(rng):
    return pieces(rng, lambda: rng.choice(EMOJI) + rng.choice(["", "", " ", " ok ", "\n"]), 8)


def cjk(rng):
    return pieces(rng, lambda: rng.choice(CJK + (" ", "AI", "2024", " the ")), 10)


def accents(rng):
    return pieces(rng, lambda: rng.choice(WORDS)[: rng.randint(0, 4)] + rng.choice(ACCENTED), 8, " ")


def rtl(rng):
    return pieces(rng, lambda: rng.choice(RTL + ("ok", "42", "(", ")")), 10, " ")


def code(rng):
    return pieces(rng, lambda: rng.choice(CODE), 3)


def unicode_soup(rng):
    # any assigned code point, weighted towards the lower planes where text lives; unassigned ones are left out because
    # the `regex` package and tiktoken's Rust regex learn of newly assigned letters in different releases
    def char():
        point = rng.randrange(rng.choice([0x80, 0x800, 0x3000, 0x10000, 0x30000, 0x110000]))
        return "?" if unicodedata.category(chr(point)) in ("Cn", "Cs") else chr(point)
    return pieces(rng, char, 20)


def mixed(rng):
    kinds = [prose, contractions, numbers, punctuation, whitespace, emoji, cjk, accents, rtl, code]
    return pieces(rng, lambda: rng.choice(kinds)(rng), 5)


def large_texts():  # -> {name: text of tens of KB}: Python's own documentation and source, and a generated mix
    return {
        "python docs": english_text(60_000),
        "python source": Path(textwrap.__file__).read_text(encoding="utf-8"),
        "generated mix": "".join(sample_strings(400, seed=1)),
    }


def english_text(n_chars):  # -> n_chars of English documentation that ships with CPython, the same on every run
    # the language reference's topics first, then the docstrings of the standard library's modules, in name order
    parts = [topics[key] for key in sorted(topics)]
    for path in sorted(Path(textwrap.__file__).parent.glob("*.py")):
        if sum(map(len, parts)) >= n_chars:
            break
        tree = ast.parse(path.read_bytes())
        nodes = [node for node in ast.walk(tree) if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))]
        parts += filter(None, map(ast.get_docstring, nodes))
    return "\n\n".join(parts)[:n_chars]
