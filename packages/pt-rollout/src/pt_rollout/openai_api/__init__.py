"""pt on the OpenAI-compatible wire, both ways: :mod:`.client` is an engine whose model a
server runs (``vllm serve``, a team's teacher), :mod:`.server` serves a checkpoint or a
running engine to OpenAI clients (lm-eval, verifiers, the ``openai`` package), and
:mod:`.protocol` is what the two speak."""
