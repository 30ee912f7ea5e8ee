"""SFT / RL data: oracle trajectories, cleaning, filtering and resampling.

Modules (import them directly; this package imports nothing, so `venus-gym data` stays
light and the oracle generator's gymnasium dependency is only loaded when used):

    oracle_data   oracle episodes of the embedded world -> Trajectory JSONL
    convert       DR-Venus / OpenAI-style records and our trajectories -> one schema
    clean         prune disallowed tool turns, drop duplicate tool interactions
    judge         correctness filter: EM/F1 or the BrowseComp LLM grader
    resample      turn-aware resampling (1x / 2x / 5x at 50 / 100 turns by default)
    report        per-stage counts, turn histograms, skipped bad lines
    pipeline      PipelineConfig, run_stages, run_pipeline
    cli           `venus-gym data convert|prune|dedup|filter|resample|report|all`

See docs/data_pipeline.md.
"""
