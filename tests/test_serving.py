"""What the servers share (venus_gym.tools.serving): the listen backlog they are given, and
one log line, no traceback, for a client that goes away. The burst itself (32 keep-alive
clients) is tests/test_reliability_reproducers.py section 4 and benchmarks/serve_burst.py."""

from __future__ import annotations

import logging

import pytest

from venus_gym.corpus import Corpus, Page
from venus_gym.tools import LocalSearchIndex, serve_index
from venus_gym.tools.serving import DEFAULT_BACKLOG, BurstHTTPServer, check_backlog

INDEX = LocalSearchIndex(Corpus([Page("https://w/1", "One", "one page")]))


@pytest.mark.parametrize("backlog", [None, 7, 512])
def test_serve_index_listens_with_the_backlog_it_is_given(backlog):
    kwargs = {} if backlog is None else {"backlog": backlog}
    server, thread, _ = serve_index(INDEX, **kwargs)
    try:
        assert server.request_queue_size == (backlog or DEFAULT_BACKLOG) and DEFAULT_BACKLOG >= 128
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "64"])
def test_a_backlog_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="backlog"):
        check_backlog(bad)
    with pytest.raises(ValueError, match="backlog"):
        serve_index(INDEX, backlog=bad)


def test_a_client_that_goes_away_is_one_line_and_other_errors_keep_their_traceback(
        caplog, capsys):
    server = BurstHTTPServer(("127.0.0.1", 0), object, backlog=4, name="test server")
    try:
        for error in (BrokenPipeError(32, "Broken pipe"), ConnectionResetError(104, "reset"),
                      TimeoutError("timed out")):
            with caplog.at_level(logging.WARNING, logger="venus_gym.serving"):
                try:
                    raise error
                except OSError:
                    server.handle_error(None, ("127.0.0.1", 5555))
        assert [r.getMessage() for r in caplog.records] == [
            "test server: client 127.0.0.1:5555 went away (BrokenPipeError: [Errno 32] "
            "Broken pipe)",
            "test server: client 127.0.0.1:5555 went away (ConnectionResetError: [Errno 104] "
            "reset)",
            "test server: client 127.0.0.1:5555 went away (TimeoutError: timed out)"]
        assert "Traceback" not in capsys.readouterr().err
        try:
            raise KeyError("a bug in a handler")
        except KeyError:
            server.handle_error(None, ("127.0.0.1", 5555))
        assert "Traceback" in capsys.readouterr().err  # a real error stays loud
    finally:
        server.server_close()
