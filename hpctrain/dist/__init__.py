"""The distributed context: who this process is in the job (`context`), the rendezvous without a
fixed port (at the address hpctrain.run.node_address decides). May import: run, slurm, config."""
