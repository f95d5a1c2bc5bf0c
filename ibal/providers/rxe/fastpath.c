/* The rxe engine's compiled byte work, bound through cffi (API mode, out of line).
 *
 * Python twin: fastpath.py, which implements every function here in pure Python
 * over zlib.crc32 and the socket module; the tests run both and compare.  Each
 * function names the Python function it mirrors.  Everything read from the
 * network is bounds-checked before use: a datagram is never trusted for a
 * length or an offset.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "fastpath.h"

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#define RXE_UDP_SEGMENT 103
#define RXE_UDP_GRO 104
#define RXE_BTH_LEN 12
#define RXE_ICRC_LEN 4
#define RXE_MAX_TRAIN 64
#define RXE_CONTROL_LEN 64

/* ------------------------------------------------------------------ CRC-32 */

/* The IEEE CRC-32 zlib.crc32 computes (reflected 0xEDB88320, pre/post inverted),
 * which is the RoCE ICRC polynomial: carry-less multiplication (PCLMULQDQ,
 * folding 64 bytes per step) where the CPU has it, else tables sliced by 8. */
static uint32_t crc_table[8][256];
static int crc_ready;
static int crc_clmul;

/* The raw register (not inverted) through n bytes, one table step per byte. */
static uint32_t crc_bytes(uint32_t c, const uint8_t *p, size_t n)
{
    while (n--)
        c = crc_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

static uint32_t crc_slice8(uint32_t c, const uint8_t *p, size_t n)
{
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
        lo = __builtin_bswap32(lo);
        hi = __builtin_bswap32(hi);
#endif
        lo ^= c;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^
            crc_table[5][(lo >> 16) & 0xFF] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    return crc_bytes(c, p, n);
}

#if defined(__x86_64__)
#include <immintrin.h>

/* Folding constants of the reflected polynomial: x^(4*128+-32) etc. mod P,
 * x^64 mod P, and the Barrett pair (mu, P'), from Intel's "Fast CRC
 * Computation for Generic Polynomials Using PCLMULQDQ". */
#define K1 0x154442bd4ULL
#define K2 0x1c6e41596ULL
#define K3 0x1751997d0ULL
#define K4 0x0ccaa009eULL
#define K5 0x163cd6124ULL
#define KP 0x1db710641ULL
#define KMU 0x1f7011641ULL

/* n >= 64 and a multiple of 16; the raw register in and out. */
__attribute__((target("pclmul,sse2"))) static uint32_t crc_fold(uint32_t c, const uint8_t *p,
                                                                 size_t n)
{
    const __m128i k12 = _mm_set_epi64x((long long)K2, (long long)K1);
    const __m128i k34 = _mm_set_epi64x((long long)K4, (long long)K3);
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x0 = _mm_loadu_si128((const __m128i *)p);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)c));
    p += 64;
    n -= 64;
#define FOLD(x, k, next)                                                                       \
    _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), \
                  next)
    while (n >= 64) {
        x0 = FOLD(x0, k12, _mm_loadu_si128((const __m128i *)p));
        x1 = FOLD(x1, k12, _mm_loadu_si128((const __m128i *)(p + 16)));
        x2 = FOLD(x2, k12, _mm_loadu_si128((const __m128i *)(p + 32)));
        x3 = FOLD(x3, k12, _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }
    x0 = FOLD(x0, k34, x1);
    x0 = FOLD(x0, k34, x2);
    x0 = FOLD(x0, k34, x3);
    while (n >= 16) {
        x0 = FOLD(x0, k34, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        n -= 16;
    }
#undef FOLD
    /* 128 -> 64 bits (K4 times the low half), then -> 32 with K5 */
    x0 = _mm_xor_si128(_mm_clmulepi64_si128(k34, x0, 0x01), _mm_srli_si128(x0, 8));
    __m128i hi = _mm_srli_si128(x0, 4);
    x0 = _mm_and_si128(x0, mask32);
    x0 = _mm_xor_si128(_mm_clmulepi64_si128(x0, _mm_set_epi64x(0, (long long)K5), 0x00), hi);
    /* Barrett reduction to the 32-bit remainder */
    const __m128i up = _mm_set_epi64x((long long)KMU, (long long)KP);
    __m128i t = _mm_and_si128(x0, mask32);
    t = _mm_clmulepi64_si128(t, up, 0x10);
    t = _mm_and_si128(t, mask32);
    t = _mm_clmulepi64_si128(t, up, 0x00);
    x0 = _mm_xor_si128(x0, t);
    return (uint32_t)_mm_cvtsi128_si32(_mm_srli_si128(x0, 4));
}
#endif

static int rxe_crc_clmul_supported(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("pclmul");
#else
    return 0;
#endif
}

/* mirrors: nothing (zlib builds its tables the same way) */
void rxe_init(void)
{
    if (crc_ready)
        return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
#if defined(__x86_64__)
#endif
    crc_clmul = rxe_crc_clmul_supported();
    crc_ready = 1;
}

/* For the tests: the table code even where the CPU multiplies carry-less. */
void rxe_crc_use_clmul(int on)
{
    crc_clmul = on && rxe_crc_clmul_supported();
}

/* Which CRC code runs: 1 carry-less multiplication, 0 tables. */
int rxe_crc_clmul(void)
{
    return crc_clmul;
}

/* mirrors: zlib.crc32(buf, crc) */
uint32_t rxe_crc32(uint32_t crc, const uint8_t *p, size_t n)
{
    uint32_t c = ~crc;
#if defined(__x86_64__)
    if (crc_clmul && n >= 64) {
        size_t body = n & ~(size_t)15;
        c = crc_fold(c, p, body);
        return ~crc_slice8(c, p + body, n - body);
    }
#endif
    return ~crc_slice8(c, p, n);
}

/* ------------------------------------------------------------------ ICRC */

static const uint8_t lrh_ones[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};

static void put16(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static uint32_t get16(const uint8_t *p)
{
    return (uint32_t)p[0] << 8 | p[1];
}

static uint32_t get24(const uint8_t *p)
{
    return (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2];
}

/* mirrors: wire.icrc_prefix_ipv4 (TOS, TTL, IP and UDP checksums masked) */
uint32_t rxe_icrc_prefix_ipv4(const uint8_t *src, const uint8_t *dst, uint32_t udp_payload_len,
                              uint32_t sport, uint32_t ident, uint32_t frag, uint32_t dport)
{
    uint8_t h[28];
    uint32_t udp_len = 8 + udp_payload_len;
    h[0] = 0x45;
    h[1] = 0xFF;
    put16(h + 2, 20 + udp_len);
    put16(h + 4, ident);
    put16(h + 6, frag);
    h[8] = 0xFF;
    h[9] = 17;
    h[10] = h[11] = 0xFF;
    memcpy(h + 12, src, 4);
    memcpy(h + 16, dst, 4);
    put16(h + 20, sport);
    put16(h + 22, dport);
    put16(h + 24, udp_len);
    h[26] = h[27] = 0xFF;
    return rxe_crc32(rxe_crc32(0, lrh_ones, 8), h, 28);
}

/* mirrors: wire.icrc (BTH byte 4 masked; the last 4 bytes are not covered).
 * len is the UDP payload's length; the caller guarantees len >= BTH + ICRC. */
uint32_t rxe_icrc(const uint8_t *udp_payload, size_t len, uint32_t prefix)
{
    uint8_t bth[RXE_BTH_LEN];
    memcpy(bth, udp_payload, RXE_BTH_LEN);
    bth[4] = 0xFF;
    uint32_t c = rxe_crc32(prefix, bth, RXE_BTH_LEN);
    return rxe_crc32(c, udp_payload + RXE_BTH_LEN, len - RXE_BTH_LEN - RXE_ICRC_LEN);
}

static uint32_t get32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ------------------------------------------------------------------ send */

/* mirrors: fastpath.send_train
 * n packets of one QP cut from `payload` (n * mtu bytes): each the BTH template
 * with PSN psn + k, mtu bytes of payload and an ICRC over IP ID id0 + k (what an
 * unconnected DF UDP socket gives the k-th GSO segment), sent with one sendmsg
 * and UDP_SEGMENT.  The payload is gathered from `payload` by the kernel (iovecs),
 * so registered memory is copied once.  Returns bytes sent or -errno. */
int64_t rxe_send_train(int fd, const uint8_t *src_ip, const uint8_t *dst_ip, uint32_t sport,
                       uint32_t dport, const uint8_t *bth, uint32_t psn, const uint8_t *payload,
                       uint32_t mtu, uint32_t n, uint32_t id0, uint8_t *scratch)
{
    struct iovec iov[3 * RXE_MAX_TRAIN];
    union {
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } ctl;
    struct sockaddr_in to;
    struct msghdr msg;
    uint32_t seg = RXE_BTH_LEN + mtu + RXE_ICRC_LEN;
    if (n == 0 || n > RXE_MAX_TRAIN || mtu == 0 || (mtu & 3) || (uint64_t)seg * n > 65507)
        return -EINVAL;
    /* scratch: n * 16 bytes (BTH and ICRC of each packet) */
    for (uint32_t k = 0; k < n; k++) {
        uint8_t *h = scratch + 16 * k;
        uint32_t p = (psn + k) & 0xFFFFFF;
        memcpy(h, bth, RXE_BTH_LEN);
        h[9] = (uint8_t)(p >> 16);
        h[10] = (uint8_t)(p >> 8);
        h[11] = (uint8_t)p;
        uint8_t masked[RXE_BTH_LEN];
        memcpy(masked, h, RXE_BTH_LEN);
        masked[4] = 0xFF;
        uint32_t c = rxe_icrc_prefix_ipv4(src_ip, dst_ip, seg, sport, (id0 + k) & 0xFFFF, 0x4000,
                                          dport);
        c = rxe_crc32(c, masked, RXE_BTH_LEN);
        c = rxe_crc32(c, payload + (size_t)k * mtu, mtu);
        uint8_t *t = h + RXE_BTH_LEN;
        t[0] = (uint8_t)c;
        t[1] = (uint8_t)(c >> 8);
        t[2] = (uint8_t)(c >> 16);
        t[3] = (uint8_t)(c >> 24);
        iov[3 * k].iov_base = h;
        iov[3 * k].iov_len = RXE_BTH_LEN;
        iov[3 * k + 1].iov_base = (void *)(payload + (size_t)k * mtu);
        iov[3 * k + 1].iov_len = mtu;
        iov[3 * k + 2].iov_base = t;
        iov[3 * k + 2].iov_len = RXE_ICRC_LEN;
    }
    memset(&to, 0, sizeof(to));
    to.sin_family = AF_INET;
    to.sin_port = htons((uint16_t)dport);
    memcpy(&to.sin_addr, dst_ip, 4);
    memset(&msg, 0, sizeof(msg));
    msg.msg_name = &to;
    msg.msg_namelen = sizeof(to);
    msg.msg_iov = iov;
    msg.msg_iovlen = 3 * n;
    if (n > 1) {
        memset(&ctl, 0, sizeof(ctl));
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof(ctl.buf);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_UDP;
        cm->cmsg_type = RXE_UDP_SEGMENT;
        cm->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        uint16_t gso = (uint16_t)seg;
        memcpy(CMSG_DATA(cm), &gso, sizeof(gso));
    }
    ssize_t r = sendmsg(fd, &msg, 0);
    return r < 0 ? -errno : r;
}

/* ------------------------------------------------------------------ receive */

struct rxe_ring {
    uint32_t depth, size;
    struct mmsghdr *msgs;
    struct iovec *iov;
    struct sockaddr_in *names;
    uint8_t *bufs;
    uint8_t *controls;
};

/* mirrors: mmsg.RecvRing.__init__ */
struct rxe_ring *rxe_ring_new(uint32_t depth, uint32_t size)
{
    if (depth == 0 || depth > 1024 || size < 64 || size > 65536)
        return NULL;
    struct rxe_ring *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    r->depth = depth;
    r->size = size;
    r->msgs = calloc(depth, sizeof(*r->msgs));
    r->iov = calloc(depth, sizeof(*r->iov));
    r->names = calloc(depth, sizeof(*r->names));
    r->bufs = malloc((size_t)depth * size);
    r->controls = calloc(depth, RXE_CONTROL_LEN);
    if (!r->msgs || !r->iov || !r->names || !r->bufs || !r->controls) {
        rxe_ring_free(r);
        return NULL;
    }
    return r;
}

void rxe_ring_free(struct rxe_ring *r)
{
    if (!r)
        return;
    free(r->msgs);
    free(r->iov);
    free(r->names);
    free(r->bufs);
    free(r->controls);
    free(r);
}

/* mirrors: mmsg.RecvRing.recv (non-blocking).  Returns datagrams or -errno. */
static int ring_recv(struct rxe_ring *r, int fd)
{
    for (uint32_t i = 0; i < r->depth; i++) {
        r->iov[i].iov_base = r->bufs + (size_t)i * r->size;
        r->iov[i].iov_len = r->size;
        struct msghdr *h = &r->msgs[i].msg_hdr;
        h->msg_name = &r->names[i];
        h->msg_namelen = sizeof(r->names[i]);
        h->msg_iov = &r->iov[i];
        h->msg_iovlen = 1;
        h->msg_control = r->controls + (size_t)i * RXE_CONTROL_LEN;
        h->msg_controllen = RXE_CONTROL_LEN;
        h->msg_flags = 0;
        r->msgs[i].msg_len = 0;
    }
    int k = recvmmsg(fd, r->msgs, r->depth, MSG_DONTWAIT, NULL);
    return k < 0 ? -errno : k;
}

/* The GRO segment size of datagram i, or 0 when it came without one. */
static uint32_t gro_size(struct rxe_ring *r, uint32_t i)
{
    struct msghdr *h = &r->msgs[i].msg_hdr;
    if (h->msg_flags & MSG_CTRUNC)
        return 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(h); c; c = CMSG_NXTHDR(h, c)) {
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == RXE_UDP_GRO &&
            c->cmsg_len >= CMSG_LEN(sizeof(int))) {
            int v;
            memcpy(&v, CMSG_DATA(c), sizeof(v));
            return v > 0 ? (uint32_t)v : 0;
        }
    }
    return 0;
}

/* mirrors: fastpath.land_segment
 * One RoCEv2 packet (a UDP payload) of the bytes-only row: ICRC checked over its
 * own IP/UDP header, then its payload copied to mem at (PSN mod slots) * mtu. */
static void land_segment(const uint8_t *seg, uint32_t len, const uint8_t *src, const uint8_t *dst,
                         uint32_t sport, uint32_t ident, uint8_t *mem, uint64_t memlen,
                         uint32_t mtu, struct rxe_bench_stats *st)
{
    if (len < RXE_BTH_LEN + RXE_ICRC_LEN) {
        st->short_ += 1;
        return;
    }
    uint32_t prefix = rxe_icrc_prefix_ipv4(src, dst, len, sport, ident, 0x4000, 4791);
    if (rxe_icrc(seg, len, prefix) != get32le(seg + len - RXE_ICRC_LEN)) {
        st->bad_icrc += 1;
        return;
    }
    uint32_t pad = (seg[1] >> 4) & 3;
    uint32_t body = len - RXE_BTH_LEN - RXE_ICRC_LEN;
    if (mtu == 0 || pad > body || body - pad > mtu || memlen < mtu) {
        st->short_ += 1;
        return;
    }
    body -= pad;
    uint64_t slots = memlen / mtu;
    uint64_t off = (uint64_t)(get24(seg + 9) % slots) * mtu;
    memcpy(mem + off, seg + RXE_BTH_LEN, body);
    st->packets += 1;
    st->bytes += body;
}

/* mirrors: fastpath.land_datagram
 * raw != 0: d is a whole IPv4 datagram from a raw socket (a GSO train arrives
 * unsegmented on lo and veth: split by seg bytes, segment k over IP ID id + k);
 * raw == 0: d is a UDP payload from peer_ip:peer_port to local_ip, split by the
 * GRO size gro (0: one packet), segment k's IP ID taken as k (what an
 * unconnected DF sender gives the k-th segment of one send). */
void rxe_land_datagram(const uint8_t *d, uint32_t len, int raw, uint32_t seg,
                       const uint8_t *peer_ip, uint32_t peer_port, const uint8_t *local_ip,
                       uint32_t gro, uint8_t *mem, uint64_t memlen, uint32_t mtu,
                       struct rxe_bench_stats *st)
{
    uint8_t src[4], dst[4];
    uint32_t sport, ident = 0, step;
    st->datagrams += 1;
    if (raw) {
        /* option-less IPv4, UDP, lengths as received, not a fragment */
        if (len < 28 || d[0] != 0x45 || d[9] != 17 || get16(d + 2) != len ||
            (get16(d + 6) & 0x3FFF) || get16(d + 24) != len - 20 || get16(d + 22) != 4791) {
            st->short_ += 1;
            return;
        }
        memcpy(src, d + 12, 4);
        memcpy(dst, d + 16, 4);
        sport = get16(d + 20);
        ident = get16(d + 4);
        d += 28;
        len -= 28;
        step = seg ? seg : len;
    } else {
        memcpy(src, peer_ip, 4);
        memcpy(dst, local_ip, 4);
        sport = peer_port & 0xFFFF;
        step = gro ? gro : len;
    }
    if (len == 0) {
        st->short_ += 1;
        return;
    }
    uint32_t s = 0;
    for (uint64_t off = 0; off < len; off += step, s++) {
        uint32_t n = len - off < step ? (uint32_t)(len - off) : step;
        land_segment(d + off, n, src, dst, sport, (ident + s) & 0xFFFF, mem, memlen, mtu, st);
    }
}

/* mirrors: fastpath.recv_bench
 * One recvmmsg on fd (raw: a raw IPv4/UDP socket; else a UDP socket with
 * UDP_GRO bound to local_ip) and every packet in it landed.  Returns the
 * datagrams read, or -errno. */
int rxe_recv_bench(int fd, struct rxe_ring *r, int raw, uint32_t seg, const uint8_t *local_ip,
                   uint8_t *mem, uint64_t memlen, uint32_t mtu, struct rxe_bench_stats *st)
{
    int k = ring_recv(r, fd);
    if (k <= 0)
        return k;
    st->calls += 1;
    for (uint32_t i = 0; i < (uint32_t)k; i++) {
        uint32_t len = r->msgs[i].msg_len;
        if (r->msgs[i].msg_hdr.msg_flags & MSG_TRUNC || len > r->size) {
            st->datagrams += 1;
            st->short_ += 1;
            continue;
        }
        rxe_land_datagram(r->bufs + (size_t)i * r->size, len, raw, seg,
                          (const uint8_t *)&r->names[i].sin_addr, ntohs(r->names[i].sin_port),
                          local_ip, raw ? 0 : gro_size(r, i), mem, memlen, mtu, st);
    }
    return k;
}

/* ------------------------------------------------------------------ trains */

/* mirrors: io.DeviceIO.send_train (its per-packet loop)
 * Packets k0 .. k0 + m - 1 of a train into m consecutive sendmmsg slots of arena
 * from byte off: each the UDP header udp8, the header template hdr (byte 4
 * masked, as the ICRC sees it) with PSN psn0 + k and AckReq when
 * (since + k) % per == 0, byte 4 restored to b4, mtu payload bytes from
 * data + data_off + k * mtu, pad zero bytes, the ICRC.  Returns 0, or -EINVAL
 * when a slot or a payload would fall outside its buffer (nothing written). */
int rxe_fill_train(uint8_t *arena, uint64_t arena_len, uint64_t off, uint32_t slot, uint32_t m,
                   const uint8_t *udp8, const uint8_t *hdr, uint32_t hlen, uint32_t b4,
                   uint32_t psn0, uint32_t k0, uint32_t since, uint32_t per, uint32_t ackreq,
                   const uint8_t *data, uint64_t data_len, uint64_t data_off, uint32_t mtu,
                   uint32_t pad, uint32_t prefix)
{
    uint8_t h[64];
    uint64_t plen = (uint64_t)hlen + mtu + pad + RXE_ICRC_LEN;
    if (per == 0 || hlen < RXE_BTH_LEN || hlen > sizeof(h) || pad > 3 || 8 + plen > slot ||
        off > arena_len || (uint64_t)m * slot > arena_len - off || data_off > data_len ||
        ((uint64_t)k0 + m) * mtu > data_len - data_off)
        return -EINVAL;
    memcpy(h, hdr, hlen);
    static const uint8_t zeros[4];
    for (uint32_t i = 0; i < m; i++) {
        uint32_t k = k0 + i;
        uint32_t word = (psn0 + k) & 0xFFFFFF;
        if ((uint32_t)(since + k) % per == 0)
            word |= ackreq;
        h[8] = (uint8_t)(word >> 24);
        h[9] = (uint8_t)(word >> 16);
        h[10] = (uint8_t)(word >> 8);
        h[11] = (uint8_t)word;
        const uint8_t *seg = data + data_off + (uint64_t)k * mtu;
        uint32_t c = rxe_crc32(rxe_crc32(prefix, h, hlen), seg, mtu);
        uint8_t *o = arena + off + (uint64_t)i * slot;
        memcpy(o, udp8, 8);
        memcpy(o + 8, h, hlen);
        o[12] = (uint8_t)b4;
        memcpy(o + 8 + hlen, seg, mtu);
        if (pad) {
            c = rxe_crc32(c, zeros, pad);
            memset(o + 8 + hlen + mtu, 0, pad);
        }
        uint8_t *t = o + 8 + hlen + mtu + pad;
        t[0] = (uint8_t)c;
        t[1] = (uint8_t)(c >> 8);
        t[2] = (uint8_t)(c >> 16);
        t[3] = (uint8_t)(c >> 24);
    }
    return 0;
}

/* ------------------------------------------------------------------ MR table */

/* The C side's view of a CA's memory regions, for the receive fast path: the
 * R_Key, PD, bounds and access checks of QpMemory.remote for regions.  A key
 * the table does not hold is a miss, never a refusal: windows and anything
 * unknown stay with the Python core, which answers them. */
struct rxe_mr {
    uint32_t rkey, access, used;
    uint64_t pd, vaddr, length;
    uint8_t *base;
};

struct rxe_mr_table {
    uint32_t mask, count;
    struct rxe_mr *slots;
};

/* mirrors: KeyTable.__init__ */
struct rxe_mr_table *rxe_mr_table_new(uint32_t capacity)
{
    if (capacity < 8 || capacity > (1u << 24) || (capacity & (capacity - 1)))
        return NULL;
    struct rxe_mr_table *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->slots = calloc(capacity, sizeof(*t->slots));
    if (!t->slots) {
        free(t);
        return NULL;
    }
    t->mask = capacity - 1;
    return t;
}

void rxe_mr_table_free(struct rxe_mr_table *t)
{
    if (t) {
        free(t->slots);
        free(t);
    }
}

static uint32_t mr_hash(uint32_t key)
{
    return key * 0x61C88647u;
}

/* The slot holding rkey, or the empty slot where it would go (linear probing;
 * the table is kept at most half full, so a probe ends). */
static struct rxe_mr *mr_slot(struct rxe_mr_table *t, uint32_t rkey)
{
    uint32_t i = mr_hash(rkey) & t->mask;
    while (t->slots[i].used && t->slots[i].rkey != rkey)
        i = (i + 1) & t->mask;
    return &t->slots[i];
}

/* mirrors: KeyTable.install (of an Mr).  Replaces an entry of the same key.
 * Returns 0, or -ENOSPC when the table would be more than half full. */
int rxe_mr_put(struct rxe_mr_table *t, uint32_t rkey, uint64_t pd, uint64_t vaddr,
               uint64_t length, uint32_t access, uint8_t *base)
{
    struct rxe_mr *m = mr_slot(t, rkey);
    if (!m->used) {
        if (2 * (t->count + 1) > t->mask + 1)
            return -ENOSPC;
        t->count += 1;
    }
    m->used = 1;
    m->rkey = rkey;
    m->pd = pd;
    m->vaddr = vaddr;
    m->length = length;
    m->access = access;
    m->base = base;
    return 0;
}

/* mirrors: KeyTable.remove.  Returns 1 when the key was there, else 0. */
int rxe_mr_del(struct rxe_mr_table *t, uint32_t rkey)
{
    struct rxe_mr *m = mr_slot(t, rkey);
    if (!m->used)
        return 0;
    /* backward-shift deletion keeps every probe chain unbroken */
    uint32_t i = (uint32_t)(m - t->slots);
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & t->mask;
        if (!t->slots[j].used)
            break;
        uint32_t home = mr_hash(t->slots[j].rkey) & t->mask;
        /* move j back to i unless its home lies cyclically in (i, j] */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            t->slots[i] = t->slots[j];
            i = j;
        }
    }
    memset(&t->slots[i], 0, sizeof(t->slots[i]));
    t->count -= 1;
    return 1;
}

/* mirrors: QpMemory.remote (regions).  1: allowed, *out the first byte (NULL for a
 * zero length, which Python allows whatever the key); 0: refused (Python answers
 * None too); -1: not in the table (ask Python). */
int rxe_mr_remote(struct rxe_mr_table *t, uint32_t rkey, uint64_t pd, uint64_t va,
                  uint64_t length, uint32_t access, uint8_t **out)
{
    *out = NULL;
    if (length == 0)
        return 1;
    struct rxe_mr *m = mr_slot(t, rkey);
    if (!m->used)
        return -1;
    if (m->pd != pd || (m->access & access) != access)
        return 0;
    if (va < m->vaddr || length > m->length || va - m->vaddr > m->length - length)
        return 0;
    *out = m->base + (va - m->vaddr);
    return 1;
}

uint32_t rxe_mr_count(struct rxe_mr_table *t)
{
    return t->count;
}

/* ------------------------------------------------------------------ receive fast path */

/* mirrors: RxDecoder._from_ip, Engine._dispatch, QpCore.receive, Responder.receive
 * and Responder._write, for the cases they predict best: in-order RC RDMA WRITEs
 * (no immediate) from the QP's peer, with the QP's P_Key, in RTS.  An entry in a
 * WRITE (active) takes its MIDDLE and LAST packets; an idle entry (idle: no
 * message in progress, remote write allowed on the QP) takes a FIRST or an ONLY
 * whose R_Key, PD, access and bounds the region table mrs accepts
 * (rxe_mr_remote, as QpMemory.remote) and then, after a FIRST, its MIDDLE and
 * LAST.  Datagrams start .. n - 1 of a receive ring are taken in order; the
 * first one that is anything else (another opcode, a gap, a duplicate, a bad
 * length, a bad ICRC, a truncated datagram, an unknown QP, an R_Key the table
 * does not hold or refuses) ends the run and its index is returned, for the
 * Python core to decode and execute (and NAK) before the run resumes: so each
 * QP sees its packets in arrival order, and every drop and every error is the
 * Python core's.  Returns n when all were landed. */
uint32_t rxe_rx_fast(const uint8_t *arena, uint32_t size, const void *msgs, uint32_t start,
                     uint32_t n, struct rxe_fast_qp *qps, uint32_t nqps,
                     struct rxe_mr_table *mrs, uint32_t write_access)
{
    const struct mmsghdr *m = msgs;
    uint32_t seed = rxe_crc32(0, lrh_ones, 8);
    for (uint32_t i = start; i < n; i++) {
        uint32_t len = m[i].msg_len;
        if ((m[i].msg_hdr.msg_flags & MSG_TRUNC) || len > size || len < 28 + RXE_BTH_LEN + 4)
            return i;
        const uint8_t *d = arena + (size_t)i * size;
        if (d[0] != 0x45)
            return i;
        uint32_t total = get16(d + 2) < len ? get16(d + 2) : len;
        uint32_t ulen = get16(d + 24);
        if (ulen < 8 + RXE_BTH_LEN + RXE_ICRC_LEN || 20 + ulen > total)
            return i;
        const uint8_t *udp = d + 28;
        uint32_t un = ulen - 8;
        uint32_t op = udp[0];
        int last = op == 0x08 || op == 0x0A;
        int first = op == 0x06 || op == 0x0A;
        if ((op != 0x07 && !last && !first) || (udp[1] & 0x0F))
            return i;
        uint32_t hlen = RXE_BTH_LEN + (first ? 16 : 0);
        uint32_t pad = (udp[1] >> 4) & 3;
        if (un - RXE_ICRC_LEN < hlen + pad)
            return i;
        uint32_t plen = un - RXE_ICRC_LEN - hlen - pad;
        uint32_t qpn = get24(udp + 5);
        struct rxe_fast_qp *e = NULL;
        for (uint32_t k = 0; k < nqps; k++)
            if ((qps[k].active || qps[k].idle) && qps[k].qpn == qpn) {
                e = &qps[k];
                break;
            }
        if (!e || memcmp(d + 12, e->src_ip, 4) || get16(udp + 2) != e->pkey ||
            get24(udp + 9) != e->epsn)
            return i;
        uint8_t *dst;
        uint64_t woff, wlen;
        uint32_t rkey = 0;
        uint64_t va = 0;
        if (first) {
            /* Responder._check_sequence and _write for a FIRST/ONLY */
            if (!e->idle || !mrs)
                return i;
            va = (uint64_t)get16(udp + 12) << 48 | (uint64_t)get16(udp + 14) << 32 |
                 (uint64_t)get16(udp + 16) << 16 | get16(udp + 18);
            rkey = get16(udp + 20) << 16 | get16(udp + 22);
            wlen = (uint64_t)get16(udp + 24) << 16 | get16(udp + 26);
            if (last ? plen > e->mtu : plen != e->mtu)
                return i;
            if (plen > wlen || (last && plen != wlen) || wlen > (1ull << 31))
                return i;
            dst = NULL;
            if (wlen && rxe_mr_remote(mrs, rkey, e->pd, va, wlen, write_access, &dst) != 1)
                return i;
            woff = 0;
        } else {
            if (!e->active)
                return i;
            if (last ? (plen == 0 || plen > e->mtu) : plen != e->mtu)
                return i;
            dst = e->dst;
            woff = e->woff;
            wlen = e->wlen;
        }
        uint64_t end = woff + plen;
        if (end > wlen || (last && end != wlen))
            return i;
        uint8_t h[40];
        memcpy(h, d, 40);
        h[1] = h[8] = h[32] = 0xFF;
        h[10] = h[11] = h[26] = h[27] = 0xFF;
        uint32_t c = rxe_crc32(rxe_crc32(seed, h, 40), udp + RXE_BTH_LEN,
                               un - RXE_BTH_LEN - RXE_ICRC_LEN);
        if (c != get32le(udp + un - RXE_ICRC_LEN))
            return i;
        if (plen)
            memcpy(dst + woff, udp + hlen, plen);
        if (first && !last) {
            e->dst = dst;
            e->wlen = wlen;
            e->rkey = rkey;
            e->va = va;
            e->started = 1;
            e->idle = 0;
            e->active = 1;
        }
        if (!last)
            e->woff = end; /* as _write: a LAST leaves the position where it was */
        e->packets += 1;
        e->bytes += len;
        if (last) {
            e->msgs += 1;
            e->last = 1;
            e->started = 0;
            e->active = 0;
            e->idle = 1;
            e->dst = NULL;
        }
        if (udp[8] & 0x80) {
            e->ack = 1;
            e->ack_psn = e->epsn;
            e->ack_last = (uint32_t)last;
            e->ack_msgs = e->msgs;
        }
        e->epsn = (e->epsn + 1) & 0xFFFFFF;
    }
    return n;
}

/* ------------------------------------------------------------------ whole WQEs */

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* mirrors: WqeRun.packets, then DeviceIO.send (encode_headers, ICRC) and
 * SendBatch.reserve for each of them
 * Packets k0 .. k0 + m - 1 of the SEND/WRITE WQE w, each into its own sendmmsg
 * slot first_slot + i of arena (UDP header, BTH, RETH on a WRITE's FIRST/ONLY,
 * ImmDt on the LAST/ONLY with imm_on, payload, pad, ICRC over the IPv4 pseudo
 * header with IP ID 0 and DF, as an unconnected raw socket sends it), and the
 * slot's iovec length set.  AckReq as the requester's cadence from since.
 * Returns the UDP payload bytes written, or -EINVAL when the run, a slot or a
 * payload would fall outside its buffer (then nothing is written). */
int64_t rxe_fill_wqe(uint8_t *arena, uint64_t arena_len, uint32_t slot, void *iov,
                     uint32_t nslots, uint32_t first_slot, const struct rxe_wqe_run *w,
                     uint32_t k0, uint32_t m, uint32_t since)
{
    static const uint8_t zeros[4];
    struct iovec *v = iov;
    uint32_t mtu = w->mtu;
    uint64_t need = w->data_len ? (w->data_len + mtu - 1) / mtu : 1;
    /* the largest packet: BTH + RETH + ImmDt, an MTU of payload, the ICRC */
    if (mtu == 0 || (mtu & 3) || mtu > 65536 || w->npkts != need || m == 0 ||
        k0 >= w->npkts || m > w->npkts - k0 || w->per_ack == 0 || since >= w->per_ack ||
        first_slot > nslots || m > nslots - first_slot ||
        8 + RXE_BTH_LEN + 16 + 4 + (uint64_t)mtu + RXE_ICRC_LEN > slot ||
        (uint64_t)(first_slot + m) * slot > arena_len)
        return -EINVAL;
    int64_t total = 0;
    uint32_t last_k = w->npkts - 1;
    uint32_t mid_prefix = 0, mid_len = 0;
    for (uint32_t i = 0; i < m; i++) {
        uint32_t k = k0 + i;
        int first = k == 0, last = k == last_k;
        uint32_t op = first ? (last ? w->op_only : w->op_first) : (last ? w->op_last : w->op_middle);
        uint64_t poff = (uint64_t)k * mtu;
        uint32_t plen = last ? (uint32_t)(w->data_len - poff) : mtu;
        uint32_t pad = -plen & 3;
        uint8_t *o = arena + (uint64_t)(first_slot + i) * slot;
        uint8_t *h = o + 8;
        h[0] = (uint8_t)op;
        h[1] = (uint8_t)((last && w->se ? 0x80 : 0) | pad << 4);
        put16(h + 2, w->pkey);
        h[4] = 0;
        h[5] = (uint8_t)(w->dest_qpn >> 16);
        h[6] = (uint8_t)(w->dest_qpn >> 8);
        h[7] = (uint8_t)w->dest_qpn;
        since += 1;
        uint32_t ack = 0;
        if (last || since >= w->per_ack) {
            ack = w->reliable ? 0x80 : 0;
            since = 0;
        }
        uint32_t psn = (w->first_psn + k) & 0xFFFFFF;
        h[8] = (uint8_t)ack;
        h[9] = (uint8_t)(psn >> 16);
        h[10] = (uint8_t)(psn >> 8);
        h[11] = (uint8_t)psn;
        uint32_t hlen = RXE_BTH_LEN;
        if (first && w->reth) {
            put32(h + hlen, (uint32_t)(w->va >> 32));
            put32(h + hlen + 4, (uint32_t)w->va);
            put32(h + hlen + 8, w->rkey);
            put32(h + hlen + 12, w->dma_len);
            hlen += 16;
        }
        if (last && w->imm_on) {
            put32(h + hlen, w->imm);
            hlen += 4;
        }
        uint32_t ulen = hlen + plen + pad + RXE_ICRC_LEN;
        put16(o, w->sport);
        put16(o + 2, w->dport);
        put16(o + 4, 8 + ulen);
        o[6] = o[7] = 0;
        uint32_t prefix;
        if (mid_len == ulen) {
            prefix = mid_prefix;
        } else {
            prefix = rxe_icrc_prefix_ipv4(w->src_ip, w->dst_ip, ulen, w->sport, 0, 0x4000,
                                          w->icrc_dport);
            mid_prefix = prefix;
            mid_len = ulen;
        }
        h[4] = 0xFF; /* the ICRC's view of the BTH */
        uint32_t c = rxe_crc32(prefix, h, hlen);
        h[4] = 0;
        if (plen) { /* a zero-length ONLY may come with no buffer at all */
            memcpy(h + hlen, w->data + poff, plen);
            c = rxe_crc32(c, h + hlen, plen);
        }
        if (pad) {
            memset(h + hlen + plen, 0, pad);
            c = rxe_crc32(c, zeros, pad);
        }
        uint8_t *t = h + hlen + plen + pad;
        t[0] = (uint8_t)c;
        t[1] = (uint8_t)(c >> 8);
        t[2] = (uint8_t)(c >> 16);
        t[3] = (uint8_t)(c >> 24);
        v[first_slot + i].iov_len = 8 + ulen;
        total += ulen;
    }
    return total;
}
