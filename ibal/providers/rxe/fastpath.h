/* The declarations of fastpath.c; also the cffi cdef (so: plain declarations only). */
struct rxe_bench_stats {
    uint64_t calls, datagrams, packets, bytes, bad_icrc, short_;
};
struct rxe_ring;

void rxe_init(void);
int rxe_crc_clmul(void);
uint32_t rxe_crc32(uint32_t crc, const uint8_t *p, size_t n);
uint32_t rxe_icrc_prefix_ipv4(const uint8_t *src, const uint8_t *dst, uint32_t udp_payload_len,
                              uint32_t sport, uint32_t ident, uint32_t frag, uint32_t dport);
uint32_t rxe_icrc(const uint8_t *udp_payload, size_t len, uint32_t prefix);
int64_t rxe_send_train(int fd, const uint8_t *src_ip, const uint8_t *dst_ip, uint32_t sport,
                       uint32_t dport, const uint8_t *bth, uint32_t psn, const uint8_t *payload,
                       uint32_t mtu, uint32_t n, uint32_t id0, uint8_t *scratch);
struct rxe_ring *rxe_ring_new(uint32_t depth, uint32_t size);
void rxe_ring_free(struct rxe_ring *r);
void rxe_land_datagram(const uint8_t *d, uint32_t len, int raw, uint32_t seg,
                       const uint8_t *peer_ip, uint32_t peer_port, const uint8_t *local_ip,
                       uint32_t gro, uint8_t *mem, uint64_t memlen, uint32_t mtu,
                       struct rxe_bench_stats *st);
void rxe_crc_use_clmul(int on);
int rxe_recv_bench(int fd, struct rxe_ring *r, int raw, uint32_t seg, const uint8_t *local_ip,
                   uint8_t *mem, uint64_t memlen, uint32_t mtu, struct rxe_bench_stats *st);
int rxe_fill_train(uint8_t *arena, uint64_t arena_len, uint64_t off, uint32_t slot, uint32_t m,
                   const uint8_t *udp8, const uint8_t *hdr, uint32_t hlen, uint32_t b4,
                   uint32_t psn0, uint32_t k0, uint32_t since, uint32_t per, uint32_t ackreq,
                   const uint8_t *data, uint64_t data_len, uint64_t data_off, uint32_t mtu,
                   uint32_t pad, uint32_t prefix);
struct rxe_mr_table;
struct rxe_mr_table *rxe_mr_table_new(uint32_t capacity);
void rxe_mr_table_free(struct rxe_mr_table *t);
int rxe_mr_put(struct rxe_mr_table *t, uint32_t rkey, uint64_t pd, uint64_t vaddr,
               uint64_t length, uint32_t access, uint8_t *base);
int rxe_mr_del(struct rxe_mr_table *t, uint32_t rkey);
int rxe_mr_remote(struct rxe_mr_table *t, uint32_t rkey, uint64_t pd, uint64_t va,
                  uint64_t length, uint32_t access, uint8_t **out);
uint32_t rxe_mr_count(struct rxe_mr_table *t);
struct rxe_fast_qp {
    uint32_t qpn, pkey, epsn, mtu, active;
    uint8_t src_ip[4];
    uint64_t woff, wlen;
    uint8_t *dst;
    uint32_t packets, last, ack, ack_psn, ack_last;
    uint64_t bytes;
    uint64_t pd, va;
    uint32_t idle, rkey, started, msgs, ack_msgs;
};
uint32_t rxe_rx_fast(const uint8_t *arena, uint32_t size, const void *msgs, uint32_t start,
                     uint32_t n, struct rxe_fast_qp *qps, uint32_t nqps,
                     struct rxe_mr_table *mrs, uint32_t write_access);
struct rxe_wqe_run {
    const uint8_t *data;
    uint64_t data_len, va;
    uint32_t rkey, dma_len, imm, imm_on, reth, se, reliable, per_ack;
    uint32_t dest_qpn, pkey, first_psn, npkts, mtu;
    uint32_t op_first, op_middle, op_last, op_only;
    uint32_t sport, dport, icrc_dport;
    uint8_t src_ip[4], dst_ip[4];
};
int64_t rxe_fill_wqe(uint8_t *arena, uint64_t arena_len, uint32_t slot, void *iov,
                     uint32_t nslots, uint32_t first_slot, const struct rxe_wqe_run *w,
                     uint32_t k0, uint32_t m, uint32_t since);
