"""SRP (SCSI RDMA Protocol): the wire formats (:mod:`.wire`) and an initiator
(:mod:`.initiator`) that logs in through ``ibal.cm.rdma`` as Linux's ``ib_srp`` does
over RoCE."""
