"""N, the naive baseline: a minimal FastAPI reward server, one forward pass per request.

This is the shape many training repositories ship (e.g. OpenRLHF's example ``serve_rm``): an
``async`` handler that tokenizes the request's texts, pads them to the request's longest
text and runs the model inline. Requests are therefore served one at a time, with no
batching across clients. It speaks the same ``POST /score {"texts": [...]}`` as the reward
server so the same load generator drives both.

One addition for the benchmark's hygiene only: a request whose client has already gone away
is skipped (the load generator abandons in-flight requests at the end of each window, and
a run must not leave work behind for the next one). ``GET /stats`` reports the requests in
flight so the benchmark can wait for the server to be idle.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time

import torch
import uvicorn
from fastapi import FastAPI, Request
from pydantic import BaseModel
from transformers import AutoModelForSequenceClassification, AutoTokenizer

logger = logging.getLogger(__name__)


class ScoreIn(BaseModel):
    """``{"texts": [...]}``."""

    texts: list[str]


class ScoreOut(BaseModel):
    """``{"scores": [...]}``."""

    scores: list[float]


def create_app(model_path: str, max_length: int = 512) -> FastAPI:
    """The naive app: load tokenizer and model, score each request on its own."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForSequenceClassification.from_pretrained(model_path).eval()
    app = FastAPI(title="naive reward server")
    state = {"in_flight": 0, "requests": 0, "texts": 0, "skipped": 0}

    @app.get("/health")
    async def health() -> dict[str, str]:
        """Always ready once started."""
        return {"status": "ok"}

    @app.get("/stats")
    async def stats() -> dict[str, float]:
        """Requests in flight, requests and texts scored, requests skipped (client gone).

        ``time`` is this process's monotonic clock: the loop answers only between forward
        passes, so a reader times the counts by it rather than by when it asked.
        """
        return {**state, "time": time.monotonic()}

    @app.post("/score", response_model=ScoreOut)
    async def score(body: ScoreIn, request: Request) -> ScoreOut:
        """Tokenize, pad to the longest text of this request, one forward pass."""
        state["in_flight"] += 1
        try:
            # uvicorn stops reading a connection while its request is handled, so a client's
            # close is only seen once reading resumes: ask (which resumes it), give the loop
            # a few turns to read the close, ask again.
            await request.is_disconnected()
            for _ in range(3):
                await asyncio.sleep(0)
            if await request.is_disconnected():
                state["skipped"] += 1
                return ScoreOut(scores=[])
            enc = tokenizer(
                body.texts,
                padding=True,
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            )
            with torch.inference_mode():
                logits = model(**enc).logits
            state["requests"] += 1
            state["texts"] += len(body.texts)
            return ScoreOut(scores=logits[:, 0].tolist())
        finally:
            state["in_flight"] -= 1

    return app


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.naive_server --model PATH --port P``."""
    parser = argparse.ArgumentParser(prog="python -m bench.naive_server")
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-length", type=int, default=512)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app = create_app(args.model, args.max_length)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
