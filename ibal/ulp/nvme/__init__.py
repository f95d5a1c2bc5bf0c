"""NVMe over Fabrics on RDMA: the wire formats (:mod:`.wire`), a host (:mod:`.host`:
controller, queues, a block device) and a target (:mod:`.target`)."""
