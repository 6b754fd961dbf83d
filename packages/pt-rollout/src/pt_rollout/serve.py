"""A generator in its own process, for a trainer's online loop.

    python -m pt_rollout.serve --socket /tmp/x.sock --model ckpt/ [--teacher big/] ...
    pt-rollout serve --listen 0.0.0.0:7000 --model ckpt/ [--teacher big/] ...

The process loads an engine (HF or vLLM; its Python can be another environment's, such
as ``.venv-vllm``), listens on a Unix socket for one client (a trainer started it), or
with ``--listen`` on a TCP address for one client at a time (a trainer on another node;
the next after the last has gone), and answers its messages in order:

- ``{"op": "generate", "key": k, "requests": [[prompt_ids, seed], ...], "params": {...},
  "score": {"top_k": K, "at_student_topk": bool} | None}`` -> the completions (and, with
  ``score``, the teacher's log-probs of them), with the weight ``version`` that made them;
- ``{"op": "load_weights", "path": dir, "version": v}`` -> the engine loads the
  checkpoint directory ``dir`` in place (no restart) and later completions carry ``v``;
  with ``"files": {name: bytes}`` in place of ``path`` (a client on another node), the
  safetensors files themselves, written to a directory in memory here and loaded;
- with ``--weight-transfer BACKEND`` (vLLM engine), vLLM's weight-transfer handshake
  (:mod:`pt_rollout.weight_transfer`): ``{"op": "init_weight_transfer", "init_info":
  {...}}`` once, then per push ``{"op": "start_weight_update"}``, ``{"op":
  "update_weights", "update_info": {...}}`` (answered once the trainer's broadcast is
  in) and ``{"op": "finish_weight_update", "version": v}`` -> later completions carry
  ``v``;
- ``{"op": "info"}`` -> the process's ``pid`` and ``cuda_visible_devices`` (the GPUs it
  was given, or None), and what a client checks before it uses a process it did not
  start: its ``engine``, ``model`` and ``model_config`` (the config's shape keys),
  ``teacher``, ``max_logprobs``, ``logprobs_mode``, ``in_flight``, ``weight_transfer``
  and weight ``version``;
- ``{"op": "close"}``.

Only plain Python values cross the socket (lists, dicts, numbers), so the two sides need
not share a torch version (but for ``--weight-transfer ipc``, whose CUDA IPC handles name
torch's types, and whose two sides share a GPU). Because messages are answered in order,
a ``load_weights`` sent after a ``generate`` does not change that generation: the client
decides which weights each round is sampled with by the order it sends them in.

Both sockets authenticate the client with a shared key (multiprocessing's HMAC challenge,
before any message is read): a Unix socket's is made by the client that starts the
process; a TCP listener's is read from ``--key-file`` (``~/.pt/serve.key`` by default),
which it writes (mode 0600) where there is none and refuses where others may read it. A
client that comes while another is served is told so and closed.

With ``--in-flight`` (vLLM engine), a ``load_weights`` that arrives while a generation
runs is not queued behind it or behind the messages that came before it: the engine loads
the weights between two of its steps and answers it at once, and the generation goes on
with the new weights (the requests keep their KV cache). Each completion then carries
``token_versions``, the version each of its tokens was sampled with; the generation's
``version`` is the one it started with.

:class:`RemoteGenerator` is the client: it starts the process, sends without waiting,
and collects each answer by its key, or, given an ``address``, connects to a process
listening there. :class:`GeneratorPool` has the same interface over several such
processes: each generation is split among them, and one that dies has its share asked for
again from another.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import queue
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pt_core.errors import PtError
from pt_core.log import get_logger

log = get_logger(__name__)

READY = "PT-SERVE-READY"
DEFAULT_KEY_FILE = "~/.pt/serve.key"
BUSY_WAIT = 10.0  # seconds a listening process waits for its client to go before refusing
# the model config's keys that say whether pushed weights fit a model
SHAPE_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size",
              "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "tie_word_embeddings")  # fmt: skip
TRANSFER_OPS = ("init_weight_transfer", "start_weight_update", "update_weights",
                "finish_weight_update")  # fmt: skip


# --------------------------------------------------------------------------- addresses


def parse_address(text: str, *, listen: bool = False) -> tuple[str, int]:
    """``"host:port"`` (a host name or an IPv4 address) as ``(host, port)``; port 0 (any
    free port) only where ``listen``. Raises ValueError saying what is wrong."""
    host, sep, port = str(text).rpartition(":")
    lowest = 0 if listen else 1
    if not sep or not host or ":" in host or not port.isdigit() or not lowest <= int(port) <= 65535:
        raise ValueError(
            f"{text!r} is not an address host:port (a host name or IPv4 address, a port "
            f"{lowest}..65535), e.g. node7:7000"
        )
    return host, int(port)


def shape_of(config: dict) -> dict:
    """A model config's :data:`SHAPE_KEYS` (a multimodal config's from its ``text_config``
    where it has none of its own)."""
    text = config.get("text_config") or {}
    return {key: config.get(key, text.get(key)) for key in SHAPE_KEYS}


def interface_addresses() -> list[str]:
    """This node's IPv4 addresses other than loopback, one per interface that has one
    (Linux's SIOCGIFADDR)."""
    import fcntl
    import struct

    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:  # no IPv4 address on it
                continue
            address = socket.inet_ntoa(packed[20:24])
            if not address.startswith("127.") and address not in found:
                found.append(address)
    return found


def how_trainers_name(port: int) -> str:
    """What a trainer on another node puts in ``rollout.servers`` for a process listening
    on every address of this node at ``port``: this node's host name where it resolves to
    an address other than loopback, else its addresses (a name that resolves to 127.0.1.1,
    as on many Debian nodes, would send the trainer to its own loopback)."""
    name = socket.gethostname()
    try:
        resolved = sorted({a[4][0] for a in socket.getaddrinfo(name, None, socket.AF_INET)})
    except OSError:
        resolved = []
    if resolved and not any(str(a).startswith("127.") for a in resolved):
        return f"a trainer's rollout.servers: [{name}:{port}]"
    addresses = interface_addresses()
    why = (
        f"this node's name {name} resolves to {', '.join(map(str, resolved))} here"
        if resolved
        else f"this node's name {name} does not resolve here"
    )
    if not addresses:
        return f"{why}, and it has no other IPv4 address: a trainer must be on this node"
    entries = ", ".join(f"{a}:{port}" for a in addresses)
    return f"a trainer's rollout.servers: [{addresses[0]}:{port}] ({why}; its addresses: {entries})"


def local_path(name: str) -> str:
    """``name`` as an absolute path where it is a path on this machine (a hub name, or a
    path that is not here, as given): what two processes compare."""
    return str(Path(name).resolve()) if Path(name).exists() else name


def keepalive(sock: socket.socket) -> None:
    """TCP keepalive on ``sock``, so that a peer that vanished (a node powered off, a
    network cut) ends the connection in about two minutes instead of never."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def key_file_path(path: str | None) -> Path:
    return Path(os.path.expanduser(path or DEFAULT_KEY_FILE))


def read_key(path: str | None, *, create: bool = False) -> bytes:
    """The shared key in ``path`` (:data:`DEFAULT_KEY_FILE` if None); ``create``: written
    first, 32 random bytes as hex, mode 0600, where there is none. A key file that others
    than its owner may read, or that is not one, raises :class:`PtError`."""
    file = key_file_path(path)
    if create and not file.exists():
        file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # written whole under another name, then linked: a server on another node that
        # shares this directory never reads half a key, and the first link wins
        fd, written = tempfile.mkstemp(dir=file.parent, prefix=".serve-key-")
        try:
            with os.fdopen(fd, "w") as fh:  # mkstemp's mode is 0600
                fh.write(secrets.token_hex(32) + "\n")
            with contextlib.suppress(FileExistsError):  # another server wrote it first
                os.link(written, file)
                log.info("wrote a new key to %s: the trainer reads the same file", file)
        finally:
            os.unlink(written)
    if not file.is_file():
        raise PtError(
            f"{file}: no key file, which a trainer needs to talk to generator processes on "
            "other nodes",
            hint="start them first (pt-rollout serve writes the key there), or copy the key "
            "file from a node where one runs (rollout.server_key_file names another)",
        )
    mode = file.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PtError(
            f"{file}: the key file may be read by others (mode {stat.filemode(mode)}), and "
            "whoever has the key can run code in the generator process",
            hint=f"chmod 600 {file}",
        )
    text = file.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise PtError(
            f"{file}: not a key (at least 32 hex digits on one line)",
            hint=f"remove {file} and start pt-rollout serve again, which writes a new one"
            if create
            else "copy the key file from a node where pt-rollout serve runs",
        )
    return key


# --------------------------------------------------------------------------- server


class ClientGone(Exception):
    """The client closed its end while a generation ran."""


def serve(args) -> None:
    from multiprocessing.connection import Listener

    from pt_rollout.engines import Request, SamplingParams, load_engine
    from pt_rollout.engines.vllm import VLLMEngine

    server = None  # --listen's socket, bound (and its key read) before the engine loads
    if args.listen:
        host, port = parse_address(args.listen, listen=True)
        authkey = read_key(args.key_file, create=True)
        try:
            server = socket.create_server((host, port), backlog=16)
        except OSError as exc:
            raise PtError(
                f"cannot listen on {args.listen}: {exc.strerror or exc}",
                hint="choose another port (0: any free one), or stop what listens there",
            ) from None
    generator = load_engine(
        args.engine,
        args.model,
        dtype=args.dtype,
        seed=args.seed,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        max_logprobs=args.max_logprobs,
        logprobs_mode=args.logprobs_mode,
        hf_decoder=args.decoder,
        in_flight=args.in_flight,
        weight_transfer=args.weight_transfer,
    )
    teacher = None
    if args.teacher:
        teacher = load_engine(
            args.teacher_engine or args.engine,
            args.teacher,
            dtype=args.dtype,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=args.max_model_len,
            max_logprobs=args.max_logprobs,
        )
    version = args.version
    later: collections.deque = collections.deque()  # read during a generation, not yet due
    push_started = 0.0  # of the weight-transfer push under way
    transfer_open = False  # a client's weight-transfer group is joined
    from transformers import AutoConfig

    model_config = shape_of(AutoConfig.from_pretrained(args.model).to_dict())

    def send(conn, message: dict) -> None:
        try:
            conn.send(message)
        except OSError:  # the client went while this answered it
            raise ClientGone from None

    def transfer(message: dict) -> dict:
        """One call of vLLM's weight-transfer handshake; the reply's fields."""
        nonlocal version, push_started
        assert isinstance(generator, VLLMEngine)  # load_engine's check of --weight-transfer
        nonlocal transfer_open
        op = message["op"]
        if op == "init_weight_transfer":
            generator.init_weight_transfer(message["init_info"])
            transfer_open = True
            return {}
        if op == "start_weight_update":
            push_started = time.perf_counter()
            generator.start_weight_update()
            return {}
        if op == "update_weights":
            generator.update_weights(message["update_info"])
            return {}
        generator.finish_weight_update()
        version = message["version"]
        return {"version": version, "seconds": time.perf_counter() - push_started}

    def load(conn, message: dict) -> None:
        nonlocal version
        start = time.perf_counter()
        received = None  # the files a client on another node sent, written here
        try:
            if message.get("files") is not None:
                base = "/dev/shm" if os.path.isdir("/dev/shm") else None
                received = tempfile.mkdtemp(prefix="pt-serve-weights-", dir=base)
                for name, data in message["files"].items():
                    Path(received, Path(name).name).write_bytes(data)
            generator.load_weights(received or message["path"])
        except Exception as exc:  # the client raises it with the message
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        else:
            version = message["version"]
            reply = {"version": version, "seconds": time.perf_counter() - start}
        finally:
            if received is not None:
                shutil.rmtree(received, ignore_errors=True)
        send(conn, {"key": message.get("key"), "op": "load_weights", **reply})

    def between_steps(conn):
        """In-flight updates: the weight loads that arrived during a generation, done
        now; other messages wait their turn."""

        def step() -> int | None:
            loaded = None
            while True:
                try:
                    if not conn.poll():
                        break
                    message = conn.recv()
                except (EOFError, OSError):  # the client is gone: no one wants this generation
                    raise ClientGone from None
                if message.get("op") == "load_weights":
                    load(conn, message)
                    loaded = version
                else:
                    later.append(message)
            return loaded

        return step

    def session(conn) -> None:
        """Answer one client until it closes (or goes)."""
        later.clear()
        while True:
            try:
                message = later.popleft() if later else conn.recv()
            except (EOFError, OSError):
                return
            op = message.get("op")
            if op == "close":
                return
            if op == "load_weights":
                load(conn, message)
                continue
            try:
                if op in TRANSFER_OPS:
                    if not args.weight_transfer:
                        raise ValueError(
                            f"{op}: this generator process was started without --weight-transfer"
                        )
                    reply = transfer(message)
                elif op == "generate":
                    start = time.perf_counter()
                    params = SamplingParams(**message["params"])
                    requests = [Request(list(ids), seed) for ids, seed in message["requests"]]
                    started_with = version
                    if args.in_flight:
                        assert isinstance(generator, VLLMEngine)  # load_engine's check
                        completions = generator.generate(
                            requests, params, between_steps=between_steps(conn),
                            version=version,
                        )  # fmt: skip
                    else:
                        completions = generator.generate(requests, params)
                    reply = {
                        "version": started_with,
                        "completions": [c.__dict__ for c in completions],
                        "generate_s": time.perf_counter() - start,
                    }
                    if message.get("score"):
                        if teacher is None:
                            raise ValueError(
                                "scores were asked of a generator process started without "
                                "a teacher (--teacher)"
                            )
                        start = time.perf_counter()
                        score = message["score"]
                        at_ids = None
                        if score.get("at_student_topk"):
                            at_ids = [c.topk_ids or [] for c in completions]
                        scores = teacher.score(
                            [r.prompt_token_ids for r in requests],
                            [c.token_ids for c in completions],
                            top_k=score.get("top_k", 0),
                            at_ids=at_ids,
                        )
                        reply["scores"] = [s.__dict__ for s in scores]
                        reply["score_s"] = time.perf_counter() - start
                elif op == "info":
                    reply = {
                        "pid": os.getpid(),
                        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "engine": args.engine,
                        "model": local_path(args.model),
                        "model_config": model_config,
                        "teacher": local_path(args.teacher) if args.teacher else None,
                        "max_logprobs": args.max_logprobs,
                        "logprobs_mode": args.logprobs_mode,
                        "in_flight": bool(args.in_flight),
                        "weight_transfer": args.weight_transfer,
                        "version": version,
                        "seed": args.seed,
                        "dtype": args.dtype,
                        "teacher_engine": (args.teacher_engine or args.engine)
                        if args.teacher
                        else None,
                    }
                else:
                    reply = {"error": f"unknown op {op!r}"}
            except ClientGone:
                return
            except Exception as exc:  # the client raises it with the message
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            send(conn, {"key": message.get("key"), "op": op, **reply})

    if server is None:
        authkey = bytes.fromhex(os.environ.pop("PT_SERVE_AUTHKEY"))
        with Listener(args.socket, family="AF_UNIX", authkey=authkey) as listener:
            print(READY, flush=True)
            with listener.accept() as conn, contextlib.suppress(ClientGone):
                session(conn)
        return
    from multiprocessing import AuthenticationError
    from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

    clients: queue.Queue = queue.Queue()
    idle = threading.Event()
    idle.set()
    handoff = threading.Lock()  # one connection at a time decides whether it is served

    def handshake(sock: socket.socket, peer) -> None:
        """Authenticate one connection (in a thread of its own, so one that says nothing
        holds up no other), then hand it to the main thread if none is served, or, once
        one is and still is a few seconds later (the time a trainer that has just left
        takes to be gone), tell it the process is busy and close it."""
        keepalive(sock)
        conn = Connection(sock.detach())
        try:
            deliver_challenge(conn, authkey)
            answer_challenge(conn, authkey)
        except Exception as exc:  # a wrong key, a port scanner, a client gone at once
            why = (
                "it did not have the key"
                if isinstance(exc, AuthenticationError)
                else f"not a trainer ({type(exc).__name__}: {exc})"
            )
            log.warning("a connection from %s was refused: %s", peer[0], why)
            conn.close()
            return
        with handoff:
            if not idle.wait(timeout=BUSY_WAIT):
                log.warning("a trainer from %s was turned away: another is being served", peer[0])
                with contextlib.suppress(OSError):
                    conn.send({"key": None, "op": "busy", "error": (
                        f"the generator at {args.listen} serves another trainer"
                    )})  # fmt: skip
                conn.close()
                return
            idle.clear()
        clients.put((conn, peer[0]))

    def accept() -> None:
        assert server is not None
        while True:
            try:
                sock, peer = server.accept()
            except OSError:  # the socket was closed: the process ends
                return
            threading.Thread(target=handshake, args=(sock, peer), daemon=True).start()

    with server:
        bound = server.getsockname()
        print(f"{READY} {bound[0]}:{bound[1]}", flush=True)
        named = f" ({how_trainers_name(bound[1])})" if bound[0] == "0.0.0.0" else ""
        log.info(
            "listening on %s:%d%s for a trainer (key %s); Ctrl-C stops", bound[0], bound[1],
            named, key_file_path(args.key_file),
        )  # fmt: skip
        threading.Thread(target=accept, daemon=True).start()
        while True:
            conn, peer = clients.get()
            log.info("a trainer connected from %s", peer)
            gone = "the trainer has gone"
            try:
                session(conn)
            except ClientGone:
                gone = "the trainer went while it was answered"
            finally:
                conn.close()
                if transfer_open:  # the next client opens a group of its own
                    assert isinstance(generator, VLLMEngine)
                    try:
                        generator.close_weight_transfer()
                    except Exception as exc:  # a push it left half done
                        log.warning(
                            "the weight-transfer group of the trainer that left could not "
                            "be closed (%s: %s); the next trainer's push may fail",
                            type(exc).__name__, exc,
                        )  # fmt: skip
                    transfer_open = False
                idle.set()
            log.info("%s; weight version %d; waiting for the next", gone, version)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--socket")
    where.add_argument("--listen")  # host:port
    parser.add_argument("--key-file", default=None)  # --listen's shared key
    parser.add_argument("--model", required=True)
    parser.add_argument("--engine", default="hf")
    parser.add_argument("--teacher", default=None)
    parser.add_argument("--teacher-engine", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--version", type=int, default=0)
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-logprobs", type=int, default=20)
    parser.add_argument("--logprobs-mode", default="raw")
    parser.add_argument("--decoder", default="auto")
    parser.add_argument("--in-flight", action="store_true")
    parser.add_argument("--weight-transfer", default=None, choices=("gloo", "ipc", "nccl"))
    serve(parser.parse_args())


# --------------------------------------------------------------------------- client


def visible_device(index: int, visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a child process that is to see device ``index`` of
    this process's own: with ``visible`` (this process's ``CUDA_VISIBLE_DEVICES``) set,
    its ``index``-th entry (``"4,5,6"`` and 1: ``"5"``), else ``index`` itself."""
    from pt_rollout.parallel import visible_entries

    entries = visible_entries(visible)
    if entries is None:
        return str(index)
    if index >= len(entries):
        raise PtError(
            f"device {index} is not among the {len(entries)} this process sees "
            f"(CUDA_VISIBLE_DEVICES={visible})"
        )
    return entries[index]


class RemoteGenerator:
    """Start ``python -m pt_rollout.serve`` and talk to it, or, given ``address``, talk to
    one listening there (``pt-rollout serve --listen``); see the module docstring."""

    def __init__(
        self,
        model: str,
        *,
        python: str | None = None,
        engine: str = "hf",
        teacher: str | None = None,
        teacher_engine: str | None = None,
        dtype: str = "auto",
        seed: int = 0,
        version: int = 0,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        max_logprobs: int = 20,
        logprobs_mode: str = "raw",
        decoder: str = "auto",
        in_flight: bool = False,
        weight_transfer: str | None = None,
        device: int | None = None,
        start_timeout: float = 900.0,
        address: str | None = None,
        key_file: str | None = None,
    ):
        """``weight_transfer``: a backend of :mod:`pt_rollout.weight_transfer` (``gloo``,
        ``ipc``, ``nccl``) for :meth:`submit_push`, which then needs vLLM in this process too.
        ``device``: the process sees that GPU only, an index among this process's own
        (:func:`visible_device`); None: the GPUs this process sees.

        ``address`` (``host:port``): no process is started; this connects to the one
        listening there with the key in ``key_file`` (:func:`read_key`), and only
        ``weight_transfer`` of the other arguments applies (the process was started with
        its own). Its weights are whatever it holds: push before generating."""
        from multiprocessing.connection import Client

        self.weight_transfer = weight_transfer
        self._transfer = None  # the trainer's engine for weight transfer, from the first push
        self._push_thread: threading.Thread | None = None
        self._held: list[dict] | None = None  # messages queued while a push is on its way
        self._lock = threading.Lock()  # one sender on the socket at a time
        self._replies: dict = {}
        self._cond = threading.Condition()
        self._next_key = 0
        self._refused: str | None = None  # a listening process's answer that it is busy
        self.address = address
        self.proc: subprocess.Popen | None = None
        self.conn = None
        if address is not None:
            self._dir = None
            self.conn = self._connect(address, key_file)
            self._reader = threading.Thread(target=self._read, args=(self.conn,), daemon=True)
            self._reader.start()
            return
        self._dir = Path(tempfile.mkdtemp(prefix="pt-serve-"))
        sock = str(self._dir / "socket")
        authkey = secrets.token_bytes(16)
        cmd = [python or sys.executable, "-m", "pt_rollout.serve", "--socket", sock,
               "--model", str(model), "--engine", engine, "--dtype", dtype, "--seed", str(seed),
               "--version", str(version), "--max-logprobs", str(max_logprobs),
               "--logprobs-mode", logprobs_mode, "--decoder", decoder]  # fmt: skip
        if teacher:
            cmd += ["--teacher", str(teacher)]
            if teacher_engine:
                cmd += ["--teacher-engine", teacher_engine]
        if gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
        if max_model_len is not None:
            cmd += ["--max-model-len", str(max_model_len)]
        if in_flight:
            cmd.append("--in-flight")
        if weight_transfer:
            cmd += ["--weight-transfer", weight_transfer]
        env = {**os.environ, "PT_SERVE_AUTHKEY": authkey.hex()}
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_device(
                device, os.environ.get("CUDA_VISIBLE_DEVICES")
            )
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=sys.stderr.fileno(), env=env, text=True
        )
        deadline = time.monotonic() + start_timeout
        assert self.proc.stdout is not None  # stdout=PIPE
        for line in self.proc.stdout:
            if line.strip() == READY:
                break
            if time.monotonic() > deadline:
                break
        if self.proc.poll() is not None or not Path(sock).exists():
            self.close()
            raise PtError(
                f"the generator process ({engine} engine, {python or sys.executable}) did not "
                "start; its errors are above",
                hint="check rollout.engine and rollout.python (e.g. .venv-vllm/bin/python)",
            )
        self.conn = Client(sock, family="AF_UNIX", authkey=authkey)
        self._reader = threading.Thread(target=self._read, args=(self.conn,), daemon=True)
        self._reader.start()

    @staticmethod
    def _connect(address: str, key_file: str | None):
        """A connection to the process listening at ``address``, authenticated."""
        from multiprocessing import AuthenticationError
        from multiprocessing.connection import Client

        try:
            host, port = parse_address(address)
        except ValueError as exc:
            raise PtError(str(exc)) from None
        key = read_key(key_file)
        try:
            conn = Client((host, port), family="AF_INET", authkey=key)
        except AuthenticationError:
            raise PtError(
                f"the generator at {address} refused the key in {key_file_path(key_file)}",
                hint="give the trainer the key file the generator process read (its log "
                "names it): rollout.server_key_file",
            ) from None
        except socket.gaierror as exc:
            raise PtError(
                f"rollout.servers: the host of {address} is not known here: {exc.strerror or exc}",
                hint="check the host name (or use the node's IPv4 address)",
            ) from None
        except OSError as exc:
            raise PtError(
                f"no generator answers at {address}: {exc.strerror or exc}",
                hint=f"start one there: pt-rollout serve --listen {host}:{port} --model DIR "
                "(or correct rollout.servers)",
            ) from None
        with socket.socket(fileno=os.dup(conn.fileno())) as own:  # the same socket
            keepalive(own)
        return conn

    def describe(self) -> str:
        """Which generator this is, for messages: its address, or its process's pid."""
        if self.address is not None:
            return f"the generator at {self.address}"
        return f"the generator process (pid {self.proc.pid if self.proc else '?'})"

    def _read(self, conn) -> None:
        while True:
            try:
                reply = conn.recv()
            except Exception:  # EOF, a reset, or the connection closed under it by close()
                with self._cond:
                    self._replies["_closed"] = True
                    self._cond.notify_all()
                return
            with self._cond:
                if reply.get("op") == "busy":  # a listening process that serves another
                    self._refused = reply.get("error")
                    continue
                self._replies[reply["key"]] = reply
                self._cond.notify_all()

    def _send(self, message: dict, *, now: bool = False) -> int:
        """Send ``message`` with a new key, or, while a push is on its way, queue it to
        follow the push (``now``: the push's own messages)."""
        if self.conn is None:
            raise PtError("the generator process was closed")
        with self._lock:
            key = self._next_key
            self._next_key += 1
            if self._held is not None and not now:
                self._held.append({**message, "key": key})
            else:
                self.conn.send({**message, "key": key})
        return key

    def submit_push(self, weights: list, version: int) -> int:
        """Send the ``(name, tensor)`` pairs ``weights`` (checkpoint names) with vLLM's
        weight-transfer API, as version ``version``; returns the key to :meth:`wait` on,
        answered like a ``load_weights``. The push runs in a thread of its own: it
        starts when the process has answered what was sent before, so ``weights`` must
        not change until it is answered (the caller's copy), and what is sent after this
        call follows it, as after a ``load_weights``. One push at a time: a second waits
        for the first to be sent."""
        if not self.weight_transfer:
            raise PtError("this generator process was started without a weight-transfer backend")
        self._join_push()
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._held = []
        self._push_thread = threading.Thread(
            target=self._push, args=(key, weights, version), daemon=True
        )
        self._push_thread.start()
        return key

    def _push(self, key: int, weights: list, version: int) -> None:
        reply: dict = {"key": key, "op": "push"}
        try:
            first = weights[0][1] if weights else None
            if first is not None and first.is_cuda:
                # CUDA IPC names the current device in its handles, and NCCL's group is
                # opened on it: this thread's is 0
                import torch

                torch.cuda.set_device(first.device)
            if self._transfer is None:
                self._transfer = self._open_transfer()
            source, client = self._transfer.source, self._transfer.client
            source.pairs, client.version = weights, version
            try:
                self._transfer.send_weights()
            finally:
                source.pairs = []
            reply.update(client.finished)
        except PtError as exc:  # raised by wait(key), in the caller's thread, as it is
            reply["pt_error"] = (exc.message, exc.hint)
        except Exception as exc:
            reply["error"] = f"weight transfer: {type(exc).__name__}: {exc}"
        finally:
            with self._lock:
                held, self._held = self._held or [], None
                with contextlib.suppress(OSError):  # the process ended: the caller sees it
                    for message in held:
                        if self.conn is not None:
                            self.conn.send(message)
            with self._cond:
                self._replies[key] = reply
                self._cond.notify_all()

    def _open_transfer(self):
        """The trainer's engine for this process's backend, met with its workers."""
        from vllm.distributed.weight_transfer.factory import (  # pyright: ignore[reportMissingImports]
            WeightTransferTrainerFactory,
        )

        from pt_rollout.weight_transfer import (
            PairsSource,
            open_port,
            register,
            trainer_init_info,
        )

        register()
        assert self.weight_transfer is not None  # submit_push's check
        host = "127.0.0.1"  # the process runs on this machine
        if self.address is not None:  # this machine's address on the way to the process
            assert self.conn is not None
            with socket.socket(fileno=os.dup(self.conn.fileno())) as own:
                host = own.getsockname()[0]
        port = open_port(host)
        info = trainer_init_info(self.weight_transfer, host=host, port=port, world_size=2)
        try:
            return WeightTransferTrainerFactory.trainer_init(
                info, client=_TransferClient(self), source=PairsSource()
            )
        except Exception as exc:  # the rendezvous of the two sides
            why = str(exc.message if isinstance(exc, PtError) else exc).removeprefix(
                "the generator failed: "
            )
            raise PtError(
                f"the {self.weight_transfer} weight-transfer group with {self.describe()} did "
                f"not form: {why}",
                hint=f"the generator must reach this machine at {host} (port {port} and the "
                "ports its backend opens), and this machine it; or use "
                "rollout.weight_transfer=files",
            ) from None

    def _join_push(self) -> None:
        thread = self._push_thread
        if thread is not None:
            thread.join()
            self._push_thread = None

    def submit_generate(self, requests, params: dict, score: dict | None = None) -> int:
        """Queue a generation; returns the key to :meth:`wait` on."""
        return self._send(
            {"op": "generate", "requests": [[list(r.prompt_token_ids), r.seed] for r in requests],
             "params": params, "score": score}
        )  # fmt: skip

    def submit_load_weights(self, path: str, version: int) -> int:
        """Queue the checkpoint directory ``path``'s weights, as version ``version``; to a
        process on another node (``address``), its safetensors files themselves."""
        if self.address is None:
            return self._send({"op": "load_weights", "path": str(path), "version": version})
        files = {f.name: f.read_bytes() for f in sorted(Path(path).glob("*.safetensors"))}
        index = Path(path) / "model.safetensors.index.json"
        if index.exists():
            files[index.name] = index.read_bytes()
        return self._send({"op": "load_weights", "files": files, "version": version})

    def done(self, key: int) -> bool:
        with self._cond:
            return key in self._replies

    def info(self) -> dict:
        """The process's ``pid`` and ``cuda_visible_devices``, in order with what was sent
        before."""
        return self.wait(self._send({"op": "info"}))

    def alive(self) -> bool:
        """Whether the process still runs (one this started) and its socket is open."""
        with self._cond:
            closed = self._replies.get("_closed", False)
        return not closed and (self.proc is None or self.proc.poll() is None)

    def exit_code(self) -> int | None:
        """The process's exit code once it ended (waiting briefly for one that closed its
        socket as it ended); None for one this did not start."""
        if self.proc is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        return self.proc.poll()

    def wait(self, key: int) -> dict:
        with self._cond:
            while key not in self._replies:
                if self._refused:
                    raise PtError(
                        self._refused,
                        hint="a generator serves one trainer at a time: wait for the other "
                        "run to end, or start one more generator for this run",
                    )
                if self.proc is None and self._replies.get("_closed"):
                    raise PtError(
                        f"{self.describe()} closed the connection; its errors are in its own log"
                    )
                if self.proc is not None and (
                    self._replies.get("_closed") or self.proc.poll() is not None
                ):
                    raise PtError(
                        f"the generator process ended (exit {self.proc.poll()}); its errors "
                        "are above"
                    )
                self._cond.wait(timeout=1.0)
            reply = self._replies.pop(key)
        if "pt_error" in reply:  # this side's own (a push's)
            message, hint = reply["pt_error"]
            raise PtError(message, hint=hint)
        if "error" in reply:
            raise PtError(f"the generator failed: {reply['error']}")
        return reply

    def close(self) -> None:
        thread = getattr(self, "_push_thread", None)
        if thread is not None and (self.proc is None or self.proc.poll() is None):
            thread.join(timeout=60)
        conn = getattr(self, "conn", None)
        if conn is not None:
            with contextlib.suppress(OSError):  # the process may have ended already
                conn.send({"op": "close"})
            conn.close()
            self.conn = None
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _TransferClient:
    """vLLM's weight-sync client (``VLLMWeightSyncClient``: the four calls of its
    handshake) over a :class:`RemoteGenerator`'s socket, each call answered before it
    returns. Used from a push's thread only: ``version`` is the push's, and ``finished``
    the process's answer to its end (the version and the seconds the push took there)."""

    def __init__(self, generator: RemoteGenerator):
        self.generator = generator
        self.version = 0
        self.finished: dict = {}

    def _call(self, message: dict) -> dict:
        generator = self.generator
        return generator.wait(generator._send(message, now=True))

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self._call({"op": "init_weight_transfer", "init_info": init_info})

    def start_weight_update(self) -> None:
        self._call({"op": "start_weight_update"})

    def update_weights(self, update_info) -> None:
        self._call({"op": "update_weights", "update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        reply = self._call({"op": "finish_weight_update", "version": self.version})
        self.finished = {"version": reply["version"], "seconds": reply["seconds"]}


class GeneratorPool:
    """``servers`` generator processes behind :class:`RemoteGenerator`'s interface.

    A generation's requests are split into contiguous, balanced shards, one per live
    process, and :meth:`wait` puts the shards' completions (and scores) back in request
    order; with per-sample seeds they are what one process gives. ``load_weights`` goes
    to every live process, so each has been sent the newest weights.

    A process that ends (killed, out of memory) is dropped with a warning and the shards
    it owed are asked for again from a live one, which was sent every push and so has
    the weights they were asked for with. Where a push was queued after a shard was
    asked for (the overlapping schedules), that generation is asked for again whole, with
    the newest weights, and answers with their version. :attr:`deaths` counts the
    processes lost; when none is left, the call that finds it raises :class:`PtError`.

    Process ``i`` gets engine seed ``seed + i`` (which only sampling with
    ``seeding: engine`` uses), so one process is started exactly as
    :class:`RemoteGenerator` is, and with ``devices``, GPU ``devices[i]`` (see
    :func:`visible_device`) rather than all this process sees.

    With ``addresses`` (``host:port`` each) no process is started: the pool connects to
    the processes listening there (``pt-rollout serve --listen``, on other nodes), one per
    address, with the key in ``key_file``; they were started with their own model and
    settings (check them with :meth:`info`), so the caller pushes its weights before it
    asks for a generation.
    """

    def __init__(self, model: str, *, servers: int = 1, seed: int = 0, version: int = 0,
                 devices: list[int] | None = None, addresses: list[str] | None = None,
                 key_file: str | None = None, **kwargs):  # fmt: skip
        if addresses is not None:
            servers = len(addresses)
        if servers < 1:
            raise PtError(f"a generator pool needs at least one process, not {servers}")
        if devices is not None and len(devices) != servers:
            raise PtError(f"{len(devices)} devices for {servers} generator processes")
        started: list[RemoteGenerator | None] = [None] * servers
        errors: list[BaseException] = []

        def start(index: int) -> None:
            try:
                if addresses is not None:
                    started[index] = RemoteGenerator(
                        model, address=addresses[index], key_file=key_file,
                        weight_transfer=kwargs.get("weight_transfer"),
                    )  # fmt: skip
                    return
                started[index] = RemoteGenerator(
                    model, seed=seed + index, version=version,
                    device=None if devices is None else devices[index], **kwargs,
                )  # fmt: skip
            except BaseException as exc:  # raised below, in the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(i,)) for i in range(servers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            for generator in started:
                if generator is not None:
                    generator.close()
            raise errors[0]
        self._generators: dict[int, RemoteGenerator] = {
            i: g for i, g in enumerate(started) if g is not None
        }  # every one started (no errors)
        self.servers = servers
        self.deaths = 0
        self._version = version  # of the newest weights sent to every live process
        self._jobs: dict[int, dict] = {}
        self._next_key = 0
        self._discard: list[tuple[int, int]] = []  # answers no longer wanted: (process, key)

    # ------------------------------------------------------------------ the interface

    def submit_generate(self, requests, params: dict, score: dict | None = None) -> int:
        """Queue a generation on every live process, a shard each; returns the key."""
        self._check()
        key = self._new_key()
        job = {"op": "generate", "requests": list(requests), "params": params,
               "score": score, "version": self._version, "shards": []}  # fmt: skip
        self._jobs[key] = job
        self._split(job)
        return key

    def submit_load_weights(self, path: str, version: int) -> int:
        """Queue the checkpoint ``path`` on every live process."""
        return self._to_every_process(
            lambda generator: generator.submit_load_weights(path, version), version
        )

    def submit_push(self, weights: list, version: int) -> int:
        """Push ``weights`` to every live process through vLLM's weight-transfer API
        (:meth:`RemoteGenerator.submit_push`: each in a thread of its own, so at once)."""
        return self._to_every_process(
            lambda generator: generator.submit_push(weights, version), version
        )

    def info(self) -> dict[int, dict]:
        """Each live process's :meth:`RemoteGenerator.info`, by its index."""
        return {index: generator.info() for index, generator in self._generators.items()}

    def _to_every_process(self, submit, version: int) -> int:
        self._check()
        key = self._new_key()
        job = {"op": "load_weights", "version": version, "keys": {}}
        self._jobs[key] = job
        ended = []
        for index in list(self._generators):
            try:
                job["keys"][index] = submit(self._generators[index])
            except OSError:  # its socket is closed: it ended
                ended.append(index)
        # Every live process has the push queued before a shard is re-sent to one.
        self._version = version
        for index in ended:
            self._drop(index)
        return key

    def done(self, key: int) -> bool:
        self._check()
        job = self._jobs[key]
        if job["op"] == "load_weights":
            return all(self._generators[i].done(k) for i, k in job["keys"].items())
        return all(
            shard["reply"] is not None or self._generators[shard["process"]].done(shard["key"])
            for shard in job["shards"]
        )

    def wait(self, key: int) -> dict:
        self._collect_discarded()
        job = self._jobs[key]
        if job["op"] == "load_weights":
            seconds = 0.0
            while job["keys"]:
                index, process_key = next(iter(job["keys"].items()))
                reply = self._wait_one(index, process_key)
                if reply is not None:
                    del job["keys"][index]
                    seconds = max(seconds, reply.get("seconds", 0.0))
            del self._jobs[key]
            return {"version": job["version"], "seconds": seconds}
        while True:
            pending = [shard for shard in job["shards"] if shard["reply"] is None]
            if not pending:
                break
            shard = pending[0]
            shard["reply"] = self._wait_one(shard["process"], shard["key"])
        del self._jobs[key]
        return self._joined(job)

    def close(self) -> None:
        threads = [threading.Thread(target=g.close) for g in self._generators.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._generators = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ shards and deaths

    def _new_key(self) -> int:
        key = self._next_key
        self._next_key += 1
        return key

    def _split(self, job: dict) -> None:
        """Shard ``job``'s requests over the live processes, contiguous and balanced (the
        first ``n % live`` shards one request longer), and send them."""
        live = sorted(self._generators)
        if not live:
            raise PtError("every generator process has ended; their errors are above")
        n = len(job["requests"])
        sizes = [n // len(live) + (j < n % len(live)) for j in range(len(live))]
        start = 0
        for index, size in zip(live, sizes, strict=True):
            if size or (n == 0 and start == 0 and index == live[0]):
                job["shards"].append({"process": index, "start": start, "stop": start + size,
                                      "key": None, "reply": None})  # fmt: skip
            start += size
        for shard in list(job["shards"]):
            self._send(job, shard)

    def _send(self, job: dict, shard: dict) -> None:
        index = shard["process"]
        try:
            shard["key"] = self._generators[index].submit_generate(
                job["requests"][shard["start"] : shard["stop"]], job["params"], job["score"]
            )
        except OSError:  # its socket is closed: it ended, and _drop re-sends this shard
            self._drop(index)

    def _wait_one(self, index: int, key: int) -> dict | None:
        """Process ``index``'s answer to ``key``, or None if the process ended (it is then
        dropped and what it owed asked for elsewhere)."""
        generator = self._generators[index]
        try:
            return generator.wait(key)
        except PtError:
            if generator.alive():  # an error the engine answered with, not a death
                raise
        self._drop(index)
        return None

    def _check(self) -> None:
        for index in [i for i, g in self._generators.items() if not g.alive()]:
            self._drop(index)

    def _drop(self, index: int) -> None:
        """Process ``index`` ended: keep what it answered, ask a live process for the rest."""
        generator = self._generators.pop(index)
        owed = []
        for job in self._jobs.values():
            if job["op"] == "load_weights":
                job["keys"].pop(index, None)
                continue
            for shard in job["shards"]:
                if shard["process"] != index or shard["reply"] is not None:
                    continue
                if shard["key"] is not None and generator.done(shard["key"]):
                    with contextlib.suppress(PtError):  # an error answer is asked for again
                        shard["reply"] = generator.wait(shard["key"])
                        continue
                owed.append((job, shard))
        self._discard = [(i, k) for i, k in self._discard if i != index]
        self.deaths += 1
        prompts = sum(shard["stop"] - shard["start"] for _, shard in owed)
        code = generator.exit_code()
        generator.close()
        if generator.address is None:
            ended = f"generator process {index} of {self.servers} ended (exit {code})"
            last = f"the last, {index}, with exit {code}"
            where, again = "above", ""
        else:
            ended = (
                f"generator {index} of {self.servers} at {generator.address} closed its connection"
            )
            last = f"the last, {index}, at {generator.address}"
            where = "in their own logs"
            again = "start pt-rollout serve again at rollout.servers' addresses; "
        if not self._generators:
            log.warning("%s; none is left", ended)
            raise PtError(
                f"every generator process has ended ({last}); their errors are {where}",
                hint=f"{again}the same pt-train command resumes the run from its last checkpoint",
            )
        running = len(self._generators)
        if prompts:
            log.warning(
                "%s: re-sending its %d prompt%s to the %d still running",
                ended, prompts, "s" if prompts > 1 else "", running,
            )  # fmt: skip
        else:
            log.warning("%s; it owed no prompts: %d still running", ended, running)
        for job, shard in owed:
            if not any(s is shard for s in job["shards"]):  # asked for again whole already
                continue
            if job["version"] == self._version:
                shard["process"] = self._least_loaded()
                shard["key"] = None
                self._send(job, shard)
                continue
            # Pushed after this shard was asked for: the live processes no longer have
            # its weights, so the generation is asked for again whole, with the newest.
            log.warning(
                "the generation was asked for with weight version %d and the processes "
                "now have %d: asking for all of it again with those",
                job["version"], self._version,
            )  # fmt: skip
            for other in job["shards"]:
                if other["reply"] is None and other["key"] is not None and other is not shard:
                    self._discard.append((other["process"], other["key"]))
            job["shards"] = []
            job["version"] = self._version
            self._split(job)

    def _least_loaded(self) -> int:
        """The live process owing the fewest prompts (the lowest index among equals)."""
        owed = dict.fromkeys(self._generators, 0)
        for job in self._jobs.values():
            for shard in job.get("shards", []):
                if shard["reply"] is None and shard["process"] in owed:
                    owed[shard["process"]] += shard["stop"] - shard["start"]
        return min(sorted(owed), key=owed.__getitem__)

    def _collect_discarded(self) -> None:
        """Take in (and drop) the answers to shards that were asked for again elsewhere."""
        keep = []
        for index, key in self._discard:
            generator = self._generators.get(index)
            if generator is None:
                continue
            if generator.done(key):
                with contextlib.suppress(PtError):
                    generator.wait(key)
            else:
                keep.append((index, key))
        self._discard = keep

    @staticmethod
    def _joined(job: dict) -> dict:
        """The shards' answers as one, in request order."""
        replies = [s["reply"] for s in sorted(job["shards"], key=lambda s: s["start"])]
        versions = {reply["version"] for reply in replies}
        if len(versions) != 1:
            raise PtError(
                f"the shards of one generation came from weight versions {sorted(versions)}; "
                "they must agree (a bug in the generator pool)"
            )
        reply = {
            "version": versions.pop(),
            "completions": [c for r in replies for c in r["completions"]],
            "generate_s": max(r.get("generate_s", 0.0) for r in replies),
        }
        if any("scores" in r for r in replies):
            reply["scores"] = [s for r in replies for s in r["scores"]]
            reply["score_s"] = max(r.get("score_s", 0.0) for r in replies)
        return reply


if __name__ == "__main__":
    main()
