"""The distributed context: who this process is in the job (`context`), the rendezvous without a
fixed port (at the address hpctrain.run.node_address decides), a sharded model's buffers kept
rank 0's (`buffers`). May import: run, slurm, config."""
