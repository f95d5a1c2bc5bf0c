"""Upper-layer protocols (channel drivers) built on ibal's public API: NVMe over Fabrics
(RDMA) host and target (:mod:`ibal.ulp.nvme`)."""
