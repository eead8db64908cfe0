"""The scoring core: the model registry (served models, their threads and lifecycle), the
scoring pipeline (select, admit, fan out, combine), the served models (render + tokenize ->
scheduler -> results), the composite-reward arithmetic and the metrics. No HTTP; torch only
inside the engines it loads."""
