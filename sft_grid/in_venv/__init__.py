"""Code that runs with the python of a backend's (or the evaluation harness's) virtual environment, never in the
orchestrator: standalone scripts and plugins that import the backend's packages (torch, transformers,
LLaMA-Factory, axolotl, DeepSpeed) and nothing of sft_grid. The orchestrator runs them as subprocesses; the
backends import the plugins from PYTHONPATH (launch.sh sets it).

- mask_probe.py: a backend's own preprocessing of a few rows, token by token (the loss-mask check);
- fetch_sample.py: a tokenizer and a few rows with the backend's own loaders (deferred checks, on the node);
- sft_grid_lf.py: LLaMA-Factory with sft_grid's jinja templates registered in every process;
- sft_grid_axolotl.py, template_integrity.py, zero_cpu.py: axolotl plugins (template in every checkpoint,
  the output contract, DeepSpeed's gloo start-up on CPU);
- leg_stop.py: the trainer callback that ends a leg of a pruned grid at its rung, both backends;
- mix_data.py: the seeded interleave of a mix, for axolotl (the same call LLaMA-Factory makes);
- prep_delphi.py: the Delphi tokenizer prep;
- post_stage.py: post-training stages that need the backend's packages (consolidate, fetch, upload);
- axolotl_check.py: axolotl's own validation of a rendered config (tests);
- build_tiny.py: the tiny local models the tests and the demo train;
- lm_eval_run.py: lm-evaluation-harness on one saved model, offline, one result per task (the harness's environment).
"""
