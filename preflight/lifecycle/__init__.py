"""Return to service: each node's path from a failing verdict to resumed, or to an RMA. A pure
state machine (``machine``), its policy from the playbooks and the site (``policy``), and the
controller that reads the store and Slurm, takes the store's lock and carries out the steps
(``controller``)."""
