"""The scoring core: the service (threads, models' lifecycle, admission), the served models
(render + tokenize -> scheduler -> results), the micro-batcher, the composite-reward
arithmetic and the metrics. No HTTP; torch only inside the engines it loads."""
