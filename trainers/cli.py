"""The `venus-gym` command.

    venus-gym demo                 # the main job: world -> oracle SFT data -> SFT -> IGPO ->
                                   #   held-out evaluation -> report (needs .[train])
    venus-gym sft --config FILE... # the SFT recipe: tokenizer, oracle data, masked SFT,
                                   #   held-out evaluation (venus-gym sft --help; .[train])
    venus-gym rl --config FILE [KEY=VALUE ...]
                                   # one RL run (IGPO, GRPO, RLOO, ...) from a YAML config,
                                   #   e.g. learner.lr=3e-4 rollout.group_size=16;
                                   #   --print-config shows the resolved config
    venus-gym oracle               # oracle agent on a fresh embedded world: episodes + score
    venus-gym world build OUT      # generate a world and save it as JSONL (corpus, tasks)
    venus-gym world info PATH      # counts and hop histogram of a saved world or QA JSONL
    venus-gym env-help             # every DeepResearch-v0 argument with its help text
    venus-gym data ...             # SFT data pipeline (venus-gym data --help; needs .[train])
    venus-gym eval --policy DIR --benchmark hotpotqa --k 2 --out DIR
                                   # evaluate a checkpoint or endpoint: pass@k, EM/F1,
                                   #   judge, report (docs/evaluate.md; needs .[train])
    venus-gym view FILE -o page.html
                                   # a static HTML page to read trajectories (eval results,
                                   #   RL samples) in a browser
    venus-gym chat --policy DIR    # ask a question, watch the agent's turns (needs .[train])
    venus-gym export-policy runs/rl/checkpoint-000016
                                   # an RL checkpoint's weights as a playable model directory
                                   #   (CHECKPOINT/policy; needs .[train])
    venus-gym serve-retrieval --world NAME_OR_PATH --port 8000
                                   # a world's pages behind POST /retrieve (Search-R1, SkyRL
                                   #   and GEM clients; docs/integrations.md)
    venus-gym serve-env --port 8000  # DeepResearch-v0 over OpenEnv's protocol (.[openenv])

The command lives in trainers, the one package allowed to import all three (venus_gym,
envs, trainers). Each subcommand imports what it needs when it runs, so `oracle`, `world`
and `env-help` work without the training extras and never load torch.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from typing import Any

from tqdm import tqdm


def cmd_demo(args: argparse.Namespace) -> int:
    from trainers.pipeline import main as pipeline_main

    return pipeline_main(["--sft-config", args.sft_config, "--rl-config", args.rl_config,
                          "--output", args.output])


def _use_policy_env(config: Any, args: argparse.Namespace) -> None:
    """The start policy's recorded env settings (its warm_start.json) for the env keys the
    config file and the overrides leave unset: a policy plays the prompt it was trained on."""
    import dataclasses

    from trainers.config_utils import keys_given
    from trainers.modeling.warm_start import policy_env

    if not config.policy.path:
        return
    given = keys_given(args.config, args.overrides, "env")
    recorded = policy_env(config.policy.path, generated_world=config.env.world == "synthetic")
    used = {key: value for key, value in recorded.items() if key not in given}
    if used:
        config.env = dataclasses.replace(config.env, **used)
        print(f"venus-gym rl: env settings of {config.policy.path} (its warm_start.json): "
              + ", ".join(f"{k}={v}" for k, v in used.items())
              + " (set env.KEY in the config or as an override to change them)",
              file=sys.stderr)


def cmd_rl(args: argparse.Namespace) -> int:
    from trainers.config_utils import config_to_yaml
    from trainers.rl.config import load_rl_config

    try:
        config = load_rl_config(args.config, args.overrides)
    except (ValueError, FileNotFoundError) as error:
        print(f"venus-gym rl: {error}", file=sys.stderr)
        return 2
    if args.world is not None:
        import dataclasses

        config.env = dataclasses.replace(config.env, world=args.world)  # validated again
    for value, section, name in ((args.policy, "policy", "path"),
                                 (args.output, "run", "output_dir"),
                                 (args.resume, "run", "resume"),
                                 (args.steps, "run", "steps")):
        if value is not None:
            setattr(getattr(config, section), name, value)
    if args.algorithm and args.algorithm != config.algorithm.name:
        # Another algorithm's options (IGPO's gamma, reward, ...) do not apply; the policy
        # loss settings do.
        config.algorithm.name = args.algorithm
        config.algorithm.options = {key: value for key, value in config.algorithm.options.items()
                                    if key == "loss"}
    if args.ray:
        config.run.use_ray = True
    _use_policy_env(config, args)
    if args.print_config:
        try:
            config.validate()
        except (ValueError, KeyError) as error:
            print(f"venus-gym rl: {error}", file=sys.stderr)
            return 2
        print(config_to_yaml(config), end="")
        return 0
    from trainers.evaluation.training_report import write_report
    from trainers.rl.driver import train

    result = train(config)
    report = write_report(result.output_dir, metrics_path=result.output_dir / "metrics.jsonl",
                          before=result.before, after=result.after,
                          title=f"venus-gym {config.algorithm.name}")
    print(f"report: {report}")
    return 0


def cmd_oracle(args: argparse.Namespace) -> int:
    import gymnasium as gym

    import envs  # noqa: F401  (registers the environments)
    from trainers.data.oracle_data import OracleMixture, run_oracle_episode

    t0 = time.perf_counter()
    env = gym.make("DeepResearch-v0", world_size=args.world_size, world_seed=args.seed)
    world = env.unwrapped.world
    print(f"world: {world.name}: {len(world.corpus)} pages, {len(world.tasks)} tasks "
          f"(built and indexed in {time.perf_counter() - t0:.1f} s)")
    tasks = env.unwrapped.tasks
    for ep in range(args.show):
        index = ep * max(1, len(tasks) // max(1, args.show)) % len(tasks)
        played = run_oracle_episode(env, index, ep, OracleMixture(1.0, args.detour_prob),
                                    None, f"oracle/{ep}")
        print(f"\n{'=' * 78}\nepisode {ep}: task {played.task_id} ({tasks[index].hops} "
              f"hops), score {played.outcome:.2f}, turns {len(played.turns)}, gold "
              f"{played.answers[0]!r}")
        for message in played.messages[1:]:  # the system prompt is the env's, always the same
            text = message["content"]
            shown = text if len(text) <= 600 else text[:600] + " [...]"
            print(f"--- {message['role']}\n{shown}")
    n = min(args.eval_tasks, len(tasks))
    by_hops: dict[int, list[float]] = {}
    turns = []
    t0 = time.perf_counter()
    for i in tqdm(range(n), desc="oracle eval", unit="task", file=sys.stderr):
        index = (i * len(tasks)) // n  # spread over the task list: every hop count
        played = run_oracle_episode(env, index, i, OracleMixture(1.0), None, f"oracle/{i}")
        by_hops.setdefault(tasks[index].hops, []).append(played.outcome)
        turns.append(len(played.turns))
    dt = time.perf_counter() - t0
    print(f"\noracle score on {n} tasks ({sum(turns) / dt:,.0f} env steps/s):")
    for h in sorted(by_hops):
        s = by_hops[h]
        print(f"  {h}-hop : {sum(s) / len(s):.3f} over {len(s)} tasks")
    allscores = [x for s in by_hops.values() for x in s]
    print(f"  all   : {sum(allscores) / len(allscores):.3f}")
    env.close()
    return 0


def cmd_world_build(args: argparse.Namespace) -> int:
    from venus_gym.worlds import load_world

    t0 = time.perf_counter()
    world = load_world("synthetic", n_pages=args.pages, seed=args.seed)
    out = world.save(args.out)
    print(f"wrote {len(world.corpus)} pages and {len(world.tasks)} tasks to {out} "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0


def cmd_world_info(args: argparse.Namespace) -> int:
    from venus_gym.worlds import load_world

    world = load_world(args.path)
    hops = Counter(t.hops for t in world.tasks)
    print(f"{world.name}: {len(world.corpus)} pages, {len(world.tasks)} tasks")
    for h in sorted(hops):
        print(f"  {h} hops: {hops[h]}")
    return 0


def cmd_env_help(args: argparse.Namespace) -> int:
    from envs.config import DeepResearchConfig

    print(DeepResearchConfig.help())
    return 0


def cmd_serve_retrieval(args: argparse.Namespace) -> int:
    from venus_gym.tools import LocalSearchIndex, serve_index
    from venus_gym.worlds import load_world

    t0 = time.perf_counter()
    kwargs = ({"n_pages": args.world_size, "seed": args.world_seed}
              if args.world == "synthetic" else {})
    world = load_world(args.world, **kwargs)
    index = LocalSearchIndex(world.corpus)
    server, thread, url = serve_index(index, host=args.host, port=args.port,
                                      max_topk=args.max_topk, default_topk=args.default_topk,
                                      **({"backlog": args.backlog} if args.backlog else {}))
    # The first line names the endpoint (scripts and tests read it, e.g. with --port 0).
    print(f"serving {url}/retrieve", flush=True)
    print(f"{world.name}: {len(world.corpus)} pages indexed in "
          f"{time.perf_counter() - t0:.1f} s; Ctrl-C stops", flush=True)
    try:
        while thread.is_alive():
            thread.join(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
    return 0


def cmd_serve_env(args: argparse.Namespace) -> int:
    try:
        from envs.integrations.openenv import bind, make_app, serve
    except ImportError as e:
        print(f"venus-gym serve-env needs openenv-core ({e}).\n"
              f"Install it with: pip install -e .[openenv]", file=sys.stderr)
        return 2
    env_kwargs = {"world": args.world, "max_turns": args.max_turns}
    if args.world == "synthetic":
        env_kwargs.update(world_size=args.world_size, world_seed=args.world_seed)
    app = make_app(env_kwargs, max_sessions=args.max_sessions,
                   idle_timeout_s=args.idle_timeout_s or None)
    backlog = args.backlog or max(128, 2 * args.max_sessions)
    sock = bind(args.host, args.port, backlog)  # listening: connects queue from here on
    host, port = sock.getsockname()[:2]
    # The first line names the server (scripts and tests read it, e.g. with --port 0).
    print(f"serving http://{host}:{port}", flush=True)
    try:
        serve(app, sock, backlog=backlog)
    except KeyboardInterrupt:
        pass
    return 0


def _needs_train_extras(command: str, error: ImportError) -> int:
    print(f"venus-gym {command} needs the training extras, which are not installed "
          f"({error}).\nInstall them with: pip install -e .[train]", file=sys.stderr)
    return 2


def cmd_data(data_argv: list[str]) -> int:
    """Hand `venus-gym data ...` to trainers.data.cli, imported only now: it needs the
    training extras, which `oracle` and `world` do not."""
    try:
        from trainers.data.cli import main as data_main
    except ImportError as e:
        return _needs_train_extras("data", e)
    return data_main(data_argv)


def cmd_sft(sft_argv: list[str]) -> int:
    """Hand `venus-gym sft ...` to the SFT recipe (trainers.sft.recipe), imported only now:
    it loads torch and transformers."""
    try:
        from trainers.sft.recipe import main as sft_main
    except ImportError as e:
        return _needs_train_extras("sft", e)
    return sft_main(sft_argv, prog="venus-gym sft")


def cmd_eval(args: argparse.Namespace) -> int:
    try:
        from trainers.evaluation.run import main_args
    except ImportError as e:
        return _needs_train_extras("eval", e)
    return main_args(args)


def cmd_view(args: argparse.Namespace) -> int:
    from trainers.evaluation.viewer import main_args

    return main_args(args)


def cmd_chat(args: argparse.Namespace) -> int:
    try:
        from trainers.evaluation.chat import main_args
    except ImportError as e:
        return _needs_train_extras("chat", e)
    return main_args(args)


def cmd_export_policy(args: argparse.Namespace) -> int:
    try:
        from trainers.rl.checkpoint import export_policy
    except ImportError as e:
        return _needs_train_extras("export-policy", e)
    try:
        dest = export_policy(args.checkpoint, args.output)
    except (FileNotFoundError, ValueError) as error:
        print(f"venus-gym export-policy: {error}", file=sys.stderr)
        return 2
    print(f"wrote {dest} (play it: venus-gym eval --policy {dest} ...)")
    return 0


def add_override_arguments(parser: argparse.ArgumentParser) -> None:
    """`dotted.key=value` overrides and --print-config (trainers.config_utils)."""
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", default=[],
                        help="config overrides after the config file, e.g. learner.lr=3e-4 "
                             "rollout.group_size=16 (values are YAML; unknown keys refused)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (file + overrides + options) as YAML "
                             "and exit")


def add_served_world_arguments(parser: argparse.ArgumentParser) -> None:
    """--world, --world-size, --world-seed of the serve-* commands."""
    parser.add_argument("--world", default="synthetic",
                        help="'synthetic', 'hotpotqa', a directory saved by World.save or a "
                             "QA JSONL")
    parser.add_argument("--world-size", type=int, default=2000,
                        help="pages of a synthetic world")
    parser.add_argument("--world-seed", type=int, default=0, help="seed of a synthetic world")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="venus-gym", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    from trainers.pipeline import DEFAULT_RL_CONFIG, DEFAULT_SFT_CONFIG  # light: paths only

    m = sub.add_parser("demo", help="the main job: world, oracle SFT data, SFT warm start, "
                                    "IGPO, held-out evaluation and a report (CPU, ~20 min)")
    m.add_argument("--sft-config", default=DEFAULT_SFT_CONFIG, help="SFT stage YAML")
    m.add_argument("--rl-config", default=DEFAULT_RL_CONFIG, help="RL stage YAML")
    m.add_argument("--output", default="runs/demo", help="where every artefact goes")
    m.set_defaults(func=cmd_demo)

    # Listed for `venus-gym --help` only, like `data` below: main() hands everything after
    # "sft" to the recipe's own parser (trainers.sft.recipe), which owns the options.
    sft = sub.add_parser("sft", help="the SFT recipe on one or more configs run in order: "
                                     "tokenizer, oracle data, masked SFT, held-out "
                                     "evaluation, RESULT lines (venus-gym sft --help)",
                         add_help=False)
    sft.set_defaults(func=lambda args: cmd_sft(["--help"]))

    r = sub.add_parser("rl", help="one RL run from a YAML config (docs/rl.md)")
    r.add_argument("--config", required=True, help="RL config YAML (trainers.rl.config)")
    add_override_arguments(r)
    r.add_argument("--policy", help="override policy.path (a model directory)")
    r.add_argument("--output", help="override run.output_dir")
    r.add_argument("--resume", help="override run.resume ('latest' or a checkpoint)")
    r.add_argument("--steps", type=int, help="override run.steps")
    r.add_argument("--algorithm", help="override algorithm.name (igpo, grpo, rloo, or a "
                                       "plug-in 'package.module:ClassName'); only the "
                                       "config's loss options are kept")
    r.add_argument("--world", help="override env.world: 'synthetic' (generated), 'hotpotqa', "
                                   "a QA JSONL or a saved world directory (docs/worlds.md)")
    r.add_argument("--ray", action="store_true", help="run the rollout workers and learners as Ray actors")
    r.set_defaults(func=cmd_rl)

    d = sub.add_parser("oracle", help="run the oracle agent on a fresh embedded world")
    d.add_argument("--world-size", type=int, default=2000, help="pages in the world")
    d.add_argument("--seed", type=int, default=0, help="world seed")
    d.add_argument("--show", type=int, default=3, help="episodes to print in full")
    d.add_argument("--eval-tasks", type=int, default=200, help="tasks to score")
    d.add_argument("--detour-prob", type=float, default=0.0,
                   help="chance of a dead end per hop in the printed episodes")
    d.set_defaults(func=cmd_oracle)

    w = sub.add_parser("world", help="build or inspect worlds")
    wsub = w.add_subparsers(dest="world_command", required=True)
    wb = wsub.add_parser("build", help="generate a synthetic world and save it as JSONL")
    wb.add_argument("out", help="output directory")
    wb.add_argument("--pages", type=int, default=2000)
    wb.add_argument("--seed", type=int, default=0)
    wb.set_defaults(func=cmd_world_build)
    wi = wsub.add_parser("info", help="summarise a world (name, directory or QA JSONL)")
    wi.add_argument("path")
    wi.set_defaults(func=cmd_world_info)

    e = sub.add_parser("env-help", help="list every DeepResearch-v0 argument")
    e.set_defaults(func=cmd_env_help)

    # Listed for `venus-gym --help` only: main() hands everything after "data" to
    # trainers.data.cli before parsing, so its own options and --help work unchanged.
    data = sub.add_parser("data", help="SFT data pipeline: convert, prune, dedup, filter, "
                                       "resample, report, all (venus-gym data --help)",
                          add_help=False)
    data.set_defaults(func=lambda args: cmd_data(["--help"]))

    from trainers.evaluation.run import add_arguments as add_eval_arguments  # light: no torch

    ev = sub.add_parser("eval", help="evaluate a saved policy or an endpoint on a benchmark: "
                                     "pass@1/avg@k/pass@k, EM/F1, optional LLM judge, "
                                     "results.jsonl and a report (docs/evaluate.md)")
    add_eval_arguments(ev)
    ev.set_defaults(func=cmd_eval)

    vw = sub.add_parser("view", help="write a self-contained HTML page to read trajectories "
                                     "(eval results.jsonl, RL samples) with filters")
    vw.add_argument("file", help="a trajectory JSONL (results.jsonl, samples/step-*.jsonl)")
    vw.add_argument("-o", "--output", default="trajectories.html", help="the page to write")
    vw.set_defaults(func=cmd_view)

    from trainers.evaluation.chat import add_arguments as add_chat_arguments  # light: no torch

    ch = sub.add_parser("chat", help="ask the agent questions and watch its turns (reasoning, "
                                     "tool calls, tool responses, answer) in the terminal")
    add_chat_arguments(ch)
    ch.set_defaults(func=cmd_chat)

    ex = sub.add_parser("export-policy", help="write an RL checkpoint's weights as a model "
                                              "directory that eval, chat, rl and the checks "
                                              "play (docs/rl.md)")
    ex.add_argument("checkpoint", help="a run's checkpoint directory (checkpoint-NNNNNN)")
    ex.add_argument("--output", default=None,
                    help="where to write the policy (default: CHECKPOINT/policy)")
    ex.set_defaults(func=cmd_export_policy)

    sr = sub.add_parser("serve-retrieval", help="serve a world's pages over POST /retrieve "
                                                "(Search-R1 JSON, SkyRL's single query, GEM's "
                                                "msgpack; HTTP/1.1 keep-alive)")
    add_served_world_arguments(sr)
    sr.add_argument("--host", default="127.0.0.1", help="address to listen on")
    sr.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    sr.add_argument("--default-topk", type=int, default=3,
                    help="documents per query when a request gives no topk")
    sr.add_argument("--max-topk", type=int, default=100,
                    help="most documents per query; a larger topk is cut and the reply says so")
    sr.add_argument("--backlog", type=int, default=None,
                    help="connections queued before they are accepted (default 128; raise it "
                         "for larger bursts of clients)")
    sr.set_defaults(func=cmd_serve_retrieval)

    se = sub.add_parser("serve-env", help="serve DeepResearch-v0 over OpenEnv's protocol "
                                          "(WebSocket sessions, /reset /step /state; needs "
                                          ".[openenv])")
    add_served_world_arguments(se)
    se.add_argument("--max-turns", type=int, default=200, help="the environment's turn budget")
    se.add_argument("--max-sessions", type=int, default=8, help="concurrent sessions")
    se.add_argument("--host", default="127.0.0.1", help="address to listen on")
    se.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    se.add_argument("--idle-timeout-s", type=float, default=600.0,
                    help="close a session that sends nothing for this long (0: never)")
    se.add_argument("--backlog", type=int, default=None,
                    help="connections queued before they are accepted (default: 128 or "
                         "twice --max-sessions, the larger)")
    se.set_defaults(func=cmd_serve_env)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "data":
        return cmd_data(argv[1:])
    if argv and argv[0] == "sft":
        return cmd_sft(argv[1:])
    parser = build_parser()
    # Overrides may also come between or after the options (`--config F --steps 2 a.b=1`).
    args, extra = parser.parse_known_args(argv)
    if extra:
        from trainers.config_utils import is_override

        if not hasattr(args, "overrides") or not all(map(is_override, extra)):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = [*args.overrides, *extra]
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
