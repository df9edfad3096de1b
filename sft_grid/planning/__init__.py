"""Layer 1, planning: from conf/ and the command line to typed, validated cells (pure: reads, never writes).

- `compose`: every cell of a grid with Hydra's own semantics, at a fraction of Hydra's cost, and the messages for
  what Hydra cannot compose (the valid keys or options, the closest one);
- `resolvers`: sft_grid's OmegaConf resolvers (${user_env:...}, ${by_size:...}) and the schema's registration;
- `cells`: a composed config made a typed `Cell`, with its identity (what determines the trained model),
  its name and what is derived from it (gradient accumulation, world size);
- `inputs`: what a cell's backend loads (a local path, a hub id, or a prepared copy of the model);
- `environments`: which virtual environment a cell trains in, and the pinned specs of the managed ones;
- `evaluation`: what a grid evaluates (suites, score identities, base models, the eval axis merged into one
  cell), the suites' rules, and the project's tiny local tasks;
- `gpus`: each cell as its GPUs run it: its memory per GPU, and the cheapest layout that fits (nodes, ZeRO, offload,
  checkpointing, packing, kernels), which every other part reads;
- `estimate`: what a cell costs before launch (tokens, FLOPs, GPU-hours, wall time, disk), and the throughput
  it is computed with (a calibration from completed cells, or a default);
- `costs`: a grid's estimates before launch (each cell's, from its data's token sample and row count), the rules
  on them (a run longer than its wall time), and the calibration from what completed cells took;
- `readable`: where a local path or a hub id can be read here, and a sample of its rows;
- `validate`: every rule over every cell (the schema's, the Hub's, those between keys), all problems at once;
- `importing/`: an existing LLaMA-Factory or axolotl training config, or the old launcher's command line, as
  sft_grid's model, dataset and sweep options, with where each of its keys went (`sft-grid import`).

Imports only sft_grid.core.
"""
