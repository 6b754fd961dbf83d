"""The calculator the example's policy calls: a tool is a plain Python function, and its
signature and docstring are the schema the chat template shows the model (pt-rollout's
docs, "Tools"). `pt-data synth calculator` writes traces that call a function of this
signature and docstring (tests/test_examples_envs.py checks that the two agree)."""


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b
