"""pt on the OpenAI-compatible wire, with the HF engine: ``pt-rollout serve-openai``
answering the official ``openai`` client and lm-evaluation-harness, and ``pt-rollout
generate/score --endpoint`` writing through it the rows the in-process engine writes, and
failing on a broken server with one line and a file to resume.

One server (the tiny Llama, HF engine) serves the module; the failures a healthy server
does not give on demand come from :class:`FaultyProxy` in front of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from openai_servers import FaultyProxy, free_port, start_pt_server

pytestmark = [pytest.mark.slow]

BIN = Path(sys.executable).parent
PROMPTS = [
    {"id": "a", "prompt": "What is 2 + 3?", "answer": "5"},
    {"id": "b", "prompt": "Name a colour.", "answer": "red"},
    {"id": "c", "prompt": [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Count to three."}], "answer": "3"},
]  # fmt: skip
# "What" ends two of the six samples of this model early (a stop string, sent as such)
SAMPLING = [
    "--n",
    "2",
    "--max-tokens",
    "12",
    "--temperature",
    "1.0",
    "--seed",
    "7",
    "--stop",
    "What",
]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    served = start_pt_server(
        tiny_model_dir, tmp_path_factory.mktemp("server") / "server.log", "--engine", "hf"
    )
    yield served
    assert served.stop() == []


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    """The same model in-process, the reference of what the server answers."""
    from pt_rollout.engines.hf import HFEngine

    return HFEngine(str(tiny_model_dir))


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in PROMPTS))
    return path


def client(server, **kwargs) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key=kwargs.pop("api_key", "unused"),
                         max_retries=0, **kwargs)  # fmt: skip


def run(*args) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / args[0]), *map(str, args[1:])], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def largest_difference(a, b) -> float:
    """The largest absolute difference between two equally nested lists of numbers."""
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        return max((largest_difference(x, y) for x, y in zip(a, b, strict=True)), default=0.0)
    return abs(a - b)


def manifest(proc) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rows(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def one_error(proc, code: int, *needles: str) -> str:
    """The one ``error:`` line of a command that failed with ``code``."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    assert not proc.stdout
    return errors[0]


# --------------------------------------------------------------------------- the openai client


def test_openai_client_gets_what_the_engine_samples(server, engine, tiny_tokenizer):
    from pt_rollout.columns import completion_text
    from pt_rollout.engines import Request, SamplingParams
    from pt_rollout.prompts import stop_token_ids

    api = client(server)
    assert [m.id for m in api.models.list().data] == [server.model]
    ids = tiny_tokenizer("The capital of France is").input_ids
    stops = stop_token_ids(server.model, tiny_tokenizer, template=False)
    # greedy, with the sampled tokens' log-probs and the top 3 at each step
    answer = api.completions.create(model=server.model, prompt=ids, max_tokens=10,
                                    temperature=0, logprobs=3,
                                    extra_body={"return_token_ids": True})  # fmt: skip
    expected = engine.generate(
        [Request(ids)],
        SamplingParams(temperature=0, max_tokens=10, stop_token_ids=stops, logprobs=True,
                       logprobs_top_k=3),
    )[0]  # fmt: skip
    choice = answer.choices[0]
    assert choice.model_extra["token_ids"] == expected.token_ids
    assert choice.text == completion_text(tiny_tokenizer, expected.token_ids, [])
    assert choice.finish_reason == expected.finish_reason
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    assert largest_difference(choice.logprobs.token_logprobs, expected.logprobs) < 1e-5
    # n samples of one seed: sample j is drawn with seed + j (vLLM's rule), as the engine does
    answer = api.completions.create(model=server.model, prompt=ids, max_tokens=10, n=2,
                                    seed=11, temperature=1.0,
                                    extra_body={"return_token_ids": True})  # fmt: skip
    seeded = engine.generate(
        [Request(ids, 11), Request(ids, 12)],
        SamplingParams(temperature=1.0, max_tokens=10, stop_token_ids=stops),
    )
    assert [c.model_extra["token_ids"] for c in answer.choices] == [c.token_ids for c in seeded]
    assert seeded[0].token_ids != seeded[1].token_ids  # two samples, not one twice
    assert answer.usage is not None and answer.usage.completion_tokens == sum(
        len(c.token_ids) for c in seeded
    )


def test_chat_uses_the_template_and_streams_what_it_answers(server, engine, tiny_tokenizer):
    from pt_rollout.engines import Request, SamplingParams
    from pt_rollout.prompts import prompt_token_ids, stop_token_ids

    api = client(server)
    messages = [{"role": "user", "content": "Say something."}]
    answer = api.chat.completions.create(model=server.model, messages=messages,  # pyright: ignore[reportArgumentType]
                                         max_tokens=16, seed=3, temperature=1.0,
                                         extra_body={"return_token_ids": True})  # fmt: skip
    choice = answer.choices[0]
    # the prompt is the checkpoint's chat template with the reply's start, and the reply
    # stops at the template's end of turn as well as at the EOS
    prompt = prompt_token_ids(tiny_tokenizer, messages)
    assert choice.model_extra["prompt_token_ids"] == prompt
    expected = engine.generate(
        [Request(prompt, 3)],
        SamplingParams(temperature=1.0, max_tokens=16,
                       stop_token_ids=stop_token_ids(server.model, tiny_tokenizer)),
    )[0]  # fmt: skip
    assert choice.model_extra["token_ids"] == expected.token_ids
    assert choice.message.role == "assistant"
    streamed, finish = [], None
    for chunk in api.chat.completions.create(model=server.model, messages=messages,  # pyright: ignore[reportArgumentType]
                                             max_tokens=16, seed=3, temperature=1.0,
                                             stream=True):  # fmt: skip
        for delta in chunk.choices:
            streamed.append(delta.delta.content or "")
            finish = delta.finish_reason or finish
    assert len([s for s in streamed if s]) > 1  # it came in pieces, as it was sampled
    assert "".join(streamed) == choice.message.content
    assert finish == choice.finish_reason


def test_what_the_server_cannot_do_is_refused_naming_the_field(server):
    api = client(server)
    with pytest.raises(openai.NotFoundError, match="not served here"):
        api.completions.create(model="another-model", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        api.completions.create(model=server.model, prompt="hi", max_tokens=2,
                               presence_penalty=0.5)  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="at most 20"):
        api.completions.create(model=server.model, prompt="hi", max_tokens=2, logprobs=21)
    # asking for nothing (a penalty of 0) is not refused
    assert api.completions.create(model=server.model, prompt="hi", max_tokens=2,
                                  presence_penalty=0).choices  # fmt: skip


def test_off_loopback_a_key_is_required(tiny_model_dir, tmp_path, cli):
    proc = cli("pt-rollout", "serve-openai", "--model", tiny_model_dir, "--listen",
               "0.0.0.0:0", check=False)  # fmt: skip
    one_error(proc, 2, "no API key", "--api-key-env")
    keyed = start_pt_server(tiny_model_dir, tmp_path / "keyed.log", "--engine", "hf",
                            "--api-key-env", "PT_TEST_KEY", "--served-model-name", "policy",
                            env={"PT_TEST_KEY": "s3cret"})  # fmt: skip
    try:
        with pytest.raises(openai.AuthenticationError):
            client(keyed, api_key="wrong").models.list()
        assert client(keyed, api_key="s3cret").models.list().data[0].id == "policy"
        prompts = tmp_path / "p.jsonl"
        prompts.write_text(json.dumps({"id": 0, "prompt": "hi"}) + "\n")
        out = tmp_path / "out.jsonl"
        # pt's client without the key: one line saying which variable it read
        served = ["--endpoint", keyed.url, "--model", "policy", "--tokenizer", tiny_model_dir]
        proc = cli("pt-rollout", "generate", *served, "--prompts", prompts, "--out", out,
                   check=False, env={"OPENAI_API_KEY": ""})  # fmt: skip
        one_error(proc, 2, "OPENAI_API_KEY is unset", "HTTP 401")
        assert not list(tmp_path.glob("out.jsonl*"))
        # a served name that is no directory here wants --tokenizer
        proc = cli("pt-rollout", "generate", "--endpoint", keyed.url, "--model", "policy",
                   "--prompts", prompts, "--out", out, check=False)  # fmt: skip
        one_error(proc, 2, "--model 'policy'", "--tokenizer DIR")
        proc = cli("pt-rollout", "generate", *served, "--prompts", prompts, "--out", out,
                   "--api-key-env", "PT_TEST_KEY", "--n", "1", "--max-tokens", "4",
                   env={"PT_TEST_KEY": "s3cret"})  # fmt: skip
        assert (manifest(proc)["rows"], manifest(proc)["model"]) == (1, "policy")
    finally:
        keyed.stop()


# --------------------------------------------------------------------------- pt as a client


@pytest.fixture(scope="module")
def in_process(tiny_model_dir, prompts_file, tmp_path_factory):
    """Rollouts and scores of the in-process HF engine: what --endpoint must write."""
    work = tmp_path_factory.mktemp("in-process")
    run("pt-rollout", "generate", "--engine", "hf", "--model", tiny_model_dir, "--prompts",
            prompts_file, "--out", work / "rollouts.jsonl", *SAMPLING, "--logprobs",
            "--logprobs-top-k", "3")  # fmt: skip
    run("pt-rollout", "score", "--engine", "hf", "--teacher", tiny_model_dir, "--rollouts",
            work / "rollouts.jsonl", "--top-k", "4", "--out", work / "scores.jsonl")  # fmt: skip
    return {"rollouts": rows(work / "rollouts.jsonl"), "scores": rows(work / "scores.jsonl")}


def test_generate_and_score_through_the_server_equal_the_engine_in_process(
    server, in_process, prompts_file, tiny_model_dir, tmp_path, cli
):
    out = tmp_path / "rollouts.jsonl"
    proc = cli("pt-rollout", "generate", "--endpoint", server.url, "--model", server.model,
               "--prompts", prompts_file, "--out", out, *SAMPLING, "--logprobs",
               "--logprobs-top-k", "3", "--concurrency", "3")  # fmt: skip
    m = manifest(proc)
    assert (m["engine"], m["endpoint"], m["rows"]) == ("endpoint", server.url, 6)
    # each sample sends its own seed: the server's engine draws what the local one draws
    through, local = rows(out), in_process["rollouts"]
    for key in ("id", "sample", "prompt_token_ids", "completion_token_ids", "completion",
                "finish_reason", "student_topk_ids"):  # fmt: skip
        assert [r[key] for r in through] == [r[key] for r in local], key
    assert [r["finish_reason"] for r in through].count("stop") == 2  # the stop string's
    assert largest_difference([r["completion_logprobs"] for r in through],
                              [r["completion_logprobs"] for r in local]) < 1e-5  # fmt: skip
    scores = tmp_path / "scores.jsonl"
    proc = cli("pt-rollout", "score", "--endpoint", server.url, "--teacher", server.model,
               "--rollouts", out, "--top-k", "4", "--out", scores)  # fmt: skip
    assert manifest(proc)["scored"] == 6
    through, local = rows(scores), in_process["scores"]
    assert [r["teacher_topk_ids"] for r in through] == [r["teacher_topk_ids"] for r in local]
    for key in ("teacher_token_logprobs", "teacher_topk_logprobs"):
        assert largest_difference([r[key] for r in through], [r[key] for r in local]) < 1e-5
    assert {r["teacher_model"] for r in through} == {str(Path(server.model).resolve())}


def test_a_server_that_fails_mid_file_leaves_a_file_to_resume(
    server, in_process, prompts_file, tmp_path, cli
):
    out = tmp_path / "rollouts.jsonl"
    args = ["--model", server.model, "--prompts", prompts_file, "--out", out, *SAMPLING,
            "--logprobs", "--logprobs-top-k", "3", "--batch-size", "2", "--retries", "1",
            "--concurrency", "1"]  # fmt: skip
    # the tokenizer check and the first batch (2 rows) pass; then every answer is a 500
    with FaultyProxy(server.url, ("status", 3, 500)) as proxy:
        proc = cli("pt-rollout", "generate", "--endpoint", proxy.url, *args, check=False)
    line = one_error(proc, 3, "HTTP 500", "2 tries")
    assert "2 rows kept" in line and "resumes after them" in line
    assert not out.exists() and len(rows(f"{out}.partial")) == 2
    proc = cli("pt-rollout", "generate", "--endpoint", server.url, *args)
    assert (manifest(proc)["resumed"], manifest(proc)["generated"]) == (2, 4)
    assert [r["completion_token_ids"] for r in rows(out)] == [
        r["completion_token_ids"] for r in in_process["rollouts"]
    ]


def test_a_server_that_cuts_its_answers_is_one_line(server, in_process, tmp_path, cli):
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("".join(json.dumps(r) + "\n" for r in in_process["rollouts"]))
    score = ["--teacher", server.model, "--rollouts", rollouts, "--top-k", "2",
             "--retries", "1"]  # fmt: skip
    # a body that stops halfway (the connection closes early): retried, then the run ends
    with FaultyProxy(server.url, ("cut", 1)) as proxy:
        proc = cli("pt-rollout", "score", "--endpoint", proxy.url, *score, "--out",
                   tmp_path / "cut.jsonl", check=False)  # fmt: skip
    one_error(proc, 3, "cut short")
    # an answer that scores fewer tokens than it was sent
    with FaultyProxy(server.url, ("shorten", "prompt_logprobs")) as proxy:
        proc = cli("pt-rollout", "score", "--endpoint", proxy.url, *score, "--out",
                   tmp_path / "short.jsonl", check=False)  # fmt: skip
    one_error(proc, 3, "the server cut the sequence")
    assert not list(tmp_path.glob("cut.jsonl*")) and not list(tmp_path.glob("short.jsonl*"))


def test_a_server_without_prompt_logprobs_is_refused_with_the_fix(
    server, in_process, tmp_path, cli
):
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("".join(json.dumps(r) + "\n" for r in in_process["rollouts"]))
    # a server that ignores vLLM's prompt_logprobs, as OpenAI's own API does
    with FaultyProxy(server.url, ("drop", "prompt_logprobs")) as proxy:
        proc = cli("pt-rollout", "score", "--endpoint", proxy.url, "--teacher", server.model,
                   "--rollouts", rollouts, "--out", tmp_path / "s.jsonl", check=False)  # fmt: skip
    one_error(proc, 2, "no prompt log-probs", "fix:", "vllm serve", "--teacher DIR")


def test_a_wrong_endpoint_or_model_is_one_line(server, prompts_file, tmp_path, cli):
    generate = ["pt-rollout", "generate", "--prompts", prompts_file, "--out", tmp_path / "o.jsonl"]
    closed = f"http://127.0.0.1:{free_port()}/v1"
    proc = cli(*generate, "--endpoint", closed, "--model", server.model, check=False)
    one_error(proc, 2, closed, "cannot connect", "start the server")
    proc = cli(*generate, "--endpoint", server.url, "--model", "other", "--tokenizer",
               server.model, check=False)  # fmt: skip
    one_error(proc, 2, "does not serve the model 'other'", server.model)
    # a local engine's option does nothing with a server: refused, not ignored
    proc = cli(*generate, "--endpoint", server.url, "--model", server.model, "--dtype",
               "bfloat16", check=False)  # fmt: skip
    one_error(proc, 2, "--dtype with --endpoint")
    # and a client setting without a server
    proc = cli(*generate, "--model", server.model, "--concurrency", "4", check=False)
    one_error(proc, 2, "--concurrency", "no --endpoint")
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- lm-evaluation-harness


TASK = """\
task: pt_wire_arith
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n\\n", "Question:"]
  max_gen_toks: 12
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
"""


def test_lm_eval_runs_a_local_task_against_the_server_and_pt_eval_grades_it(server, tmp_path, cli):
    """lm-evaluation-harness's local-completions model sends a local-file task's prompts to
    pt's server; its samples file is what pt-eval grade reads. The task's gold answers are
    the server's own greedy answers (asked with the openai client), so its exact match is
    1 exactly when lm-eval got those answers through the wire."""
    api = client(server)
    questions = ["What is 2 + 3?", "What is 7 - 4?", "Name a prime."]
    docs = []
    for i, question in enumerate(questions):
        answer = api.completions.create(model=server.model, prompt=f"Question: {question}\nAnswer:",
                                        max_tokens=12, temperature=0,
                                        stop=["\n\n", "Question:"]).choices[0].text  # fmt: skip
        docs.append({"id": i, "question": question, "answer": answer})
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "pt_wire_arith.yaml").write_text(TASK.format(data=data))
    env = {**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
    model_args = (f"model={server.model},base_url={server.url}/completions,"
                  f"tokenizer_backend=huggingface,tokenizer={server.model},num_concurrent=2,"
                  "max_retries=1")  # fmt: skip
    proc = subprocess.run(
        [str(BIN / "lm_eval"), "--model", "local-completions", "--model_args", model_args,
         "--tasks", "pt_wire_arith", "--include_path", str(tasks), "--output_path",
         str(tmp_path / "results"), "--log_samples"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    [results] = (tmp_path / "results").rglob("results_*.json")
    metrics = json.loads(results.read_text())["results"]["pt_wire_arith"]
    assert metrics["exact_match,none"] == 1.0
    [samples] = (tmp_path / "results").rglob("samples_pt_wire_arith_*.jsonl")
    assert [r["filtered_resps"][0] for r in rows(samples)] == [d["answer"] for d in docs]
    m = manifest(cli("pt-eval", "grade", samples, "--workers", "1"))
    assert (m["problems"], m["samples"], m["pred_key"], m["gold_key"]) == (
        3, 3, "filtered_resps", "target",
    )  # fmt: skip
    graded = rows(samples.with_name(samples.stem + ".grades.jsonl"))
    assert [g["doc_id"] for g in graded] == [0, 1, 2]
    # one response a document (filtered_resps is a list of one): one grade each
    assert all(len(g["grade_status"]) == len(g["correct"]) == 1 for g in graded)
    assert m["correct"] == sum(g["correct"][0] for g in graded)


# --------------------------------------------------------------------------- an engine in hand


def test_an_engine_in_hand_is_served_in_a_thread_taking_turns_through_a_lock(
    engine, tiny_tokenizer, tiny_model_dir
):
    """What an online run can do with the engine it generates with: serve it from a thread
    of its own process, its own calls and the server's taking turns through one lock."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from pt_rollout.engines import Request, SamplingParams
    from pt_rollout.openai_api.server import OpenAIServer
    from pt_rollout.prompts import stop_token_ids

    lock = threading.Lock()
    stops = stop_token_ids(tiny_model_dir, tiny_tokenizer, template=False)
    server = OpenAIServer(engine, tiny_tokenizer, model_name="policy", stop_ids=stops,
                          chat_stop_ids=stop_token_ids(tiny_model_dir, tiny_tokenizer),
                          lock=lock)  # fmt: skip
    url = server.start("127.0.0.1", 0)
    try:
        api = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        ids = tiny_tokenizer("Once upon a time").input_ids
        with ThreadPoolExecutor(1) as pool:
            with lock:  # the loop's turn: the request waits until it is over
                asked = pool.submit(api.completions.create, model="policy", prompt=ids,
                                    max_tokens=6, temperature=0,
                                    extra_body={"return_token_ids": True})  # fmt: skip
                time.sleep(2)  # time enough to answer, were the engine free
                finished_early = asked.done()
            answer = asked.result(timeout=120)
        assert not finished_early
        expected = engine.generate(
            [Request(ids)], SamplingParams(temperature=0, max_tokens=6, stop_token_ids=stops)
        )[0]
        assert answer.choices[0].model_extra["token_ids"] == expected.token_ids
    finally:
        server.stop()
