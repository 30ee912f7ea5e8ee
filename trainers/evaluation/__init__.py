"""Evaluation and inspection of a policy.

    evaluate        play held-out tasks (the training rollouts' episode runner), summarise
    metrics         per-trajectory statistics shared by training logs and evaluation
    run             `venus-gym eval`: resumable results JSONL, judges, reports
    report          pass@k / avg@k with task-clustered standard errors, tables and plots
    stats           pass@k estimators and the task-clustered bootstrap
    paired          several policies on the same tasks and sampling seeds, paired SEs
    training_report the report of a training run (curves, before / after)
    viewer          `venus-gym view`: a self-contained HTML trajectory viewer
    chat            `venus-gym chat`: ask a question, watch the agent work

Import the modules directly; this package imports nothing itself.
"""
