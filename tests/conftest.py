"""Suite-wide settings.

Tiny models on a shared 2-core machine run several times faster single-threaded (thread
hand-off dominates their matmuls), and one thread keeps CPU results reproducible.
"""

import os
import sys

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

try:
    import torch
except ImportError:  # the environment tests need no torch
    torch = None

if torch is not None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def single_thread():
    """One torch thread for a module whose code sets its own (a Learner's `threads`): tiny
    forwards are dominated by thread synchronisation on a shared 2-core machine. Use it
    with `pytestmark = pytest.mark.usefixtures("single_thread")`."""
    if torch is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# The RL tests' world and policy: a random tiny model whose tokenizer knows that world.
RL_TEST_WORLD = {"world_size": 300, "world_seed": 3}


def save_tiny_policy(directory, texts, vocab_size: int, **model) -> str:
    """A random tiny causal LM with a ChatML tokenizer trained on `texts`, saved to
    `directory` (save_pretrained); returns the directory as a string."""
    from trainers.modeling.models import build_chatml_tokenizer, build_tiny_causal_lm

    tokenizer = build_chatml_tokenizer(texts, vocab_size=vocab_size)
    build_tiny_causal_lm(tokenizer, seed=0, **model).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> str:
    """The RL tests' policy (tests/test_rl_*.py): vocabulary of RL_TEST_WORLD, hidden 64."""
    from trainers.data.oracle_data import world_texts

    return save_tiny_policy(tmp_path_factory.mktemp("policy"), world_texts(RL_TEST_WORLD),
                            2048, hidden=64, layers=2, heads=2)


@pytest.fixture(scope="module")
def phrase_policy_dir(tmp_path_factory) -> str:
    """A policy for learner tests on synthetic batches: a 300-token vocabulary."""
    return save_tiny_policy(tmp_path_factory.mktemp("policy"),
                            ["where was ada born? search the page, answer london"] * 8, 300,
                            hidden=64, layers=2)


# The OpenEnv server (`venus-gym serve-env`) on a free loopback port, for the tests of its
# HTTP and WebSocket API: the embedded world, small.
OPENENV_KW = {"world_size": 100, "world_seed": 1, "max_turns": 6}


@pytest.fixture(scope="module")
def openenv_server():
    """"http://127.0.0.1:PORT" of an OpenEnv server of OPENENV_KW, run in a thread."""
    pytest.importorskip("openenv.core.env_server.http_server")
    pytest.importorskip("websockets")
    import threading
    import time

    import uvicorn

    from envs.integrations.openenv import bind, make_app

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(make_app(OPENENV_KW), log_level="warning",
                                           ws="websockets-sansio"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


def pytest_collection_modifyitems(config, items):
    """Modules with `slow`-marked tests run first, so that on pytest-xdist workers (a module
    per worker at a time, in this order) the long modules start at once and the short ones
    fill in around them, instead of a long module starting last and running alone. The
    simulated multi-node Ray clusters (tests/test_ray_multinode.py) run after every other
    test: they start and remove whole raylets, and nothing else should share the machine's
    Ray state with them."""
    slow_modules = {item.nodeid.split("::")[0] for item in items
                    if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: (item.nodeid.startswith("tests/test_ray_multinode.py"),
                                 item.nodeid.split("::")[0] not in slow_modules))


# Tests that start Ray carry the `ray` mark: `make test` runs the others on two pytest-xdist
# workers and these one at a time beside them, with Ray's workers at the default priority
# (at Ray's own nice 15 they starve beside a busy pytest worker, minutes per test). A test
# that starts Ray without the mark fails here.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    item.ray_was_up = _ray_is_up()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield
    if not getattr(item, "ray_was_up", True) and _ray_is_up() and \
            item.get_closest_marker("ray") is None:
        pytest.fail("this test started Ray: mark it @pytest.mark.ray (make test runs Ray "
                    "tests in their own pass, one at a time)", pytrace=False)
    return result


def _ray_is_up() -> bool:
    ray = sys.modules.get("ray")  # never import Ray here: most tests do not need it
    return ray is not None and hasattr(ray, "is_initialized") and ray.is_initialized()
