/*
 * The extended verbs of librsnic_verbs.so seen from C (issue 40, items 5
 * and 6), as verbs_check.c: compiled against the system's verbs.h, linked
 * with -libverbs, run preloaded on a looped-back net_ring0 port by
 * scripts/verbs-abi.sh ("abi" part), two RC QPs of this process connected
 * to each other through the wire path.
 *
 * Checks: ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS (which
 * flags, which errno: rxe's check_qp_init_attr), ibv_qp_to_qp_ex, every
 * ibv_wr_* builder and setter an RC QP takes with the data checked at the
 * other end, the batch's all-or-nothing errors (ibv_wr_post(3)),
 * ibv_create_cq_ex with the iterator and the readers of the wc_flags asked
 * for, ibv_resize_cq (growing keeps the queued completions, a size below
 * them is EINVAL), ibv_rereg_mr of access, PD and translation with the
 * rkey checked by the responder, and the return codes of ibv_rereg_mr(3).
 * Exits 0 only if every check passed; prints one line per check.
 */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "check.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static char buf[2][1 << 16] __attribute__((aligned(64)));

#define ALL_RC_OPS                                                                                      \
	(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |          \
	 IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | \
	 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD)

/* An extended RC QP (send_ops 0: none asked for, no SEND_OPS_FLAGS). */
static struct ibv_qp *qp_ex(struct ibv_cq *cq, uint64_t ops, uint32_t depth, uint32_t sge, uint32_t inl)
{
	struct ibv_qp_init_attr_ex a = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
		.cap = { .max_send_wr = depth, .max_recv_wr = 64, .max_send_sge = sge, .max_recv_sge = 4,
			 .max_inline_data = inl },
		.comp_mask = IBV_QP_INIT_ATTR_PD | (ops ? IBV_QP_INIT_ATTR_SEND_OPS_FLAGS : 0),
		.send_ops_flags = ops,
	};
	return ibv_create_qp_ex(ctx, &a);
}

static int modify(struct ibv_qp *a, struct ibv_qp *b, uint32_t psn_a, uint32_t psn_b)
{
	struct ibv_qp_attr i = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
						    IBV_ACCESS_REMOTE_ATOMIC };
	int im = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = b->qp_num,
				 .rq_psn = psn_b, .max_dest_rd_atomic = 4, .min_rnr_timer = 12,
				 .ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 1 } } };
	int rm = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	struct ibv_qp_attr s = { .qp_state = IBV_QPS_RTS, .sq_psn = psn_a, .timeout = 14, .retry_cnt = 7,
				 .rnr_retry = 7, .max_rd_atomic = 4 };
	int sm = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		 IBV_QP_MAX_QP_RD_ATOMIC;
	if (a->state == IBV_QPS_RESET && ibv_modify_qp(a, &i, im))
		return -1;
	return ibv_modify_qp(a, &r, rm) || ibv_modify_qp(a, &s, sm);
}

static int connect2(struct ibv_qp *a, struct ibv_qp *b)
{
	struct ibv_qp_attr i = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
						    IBV_ACCESS_REMOTE_ATOMIC };
	int im = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	if (!a || !b || ibv_modify_qp(a, &i, im) || ibv_modify_qp(b, &i, im))
		return -1;
	return modify(a, b, 100, 200) || modify(b, a, 200, 100);
}

/* One completion within 5 s through ibv_poll_cq. */
static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 5)
			return 0;
	}
}

/* A completion taken through the extended iterator within 5 s. */
struct exwc {
	uint64_t wr_id;
	enum ibv_wc_status status;
	enum ibv_wc_opcode opcode;
	uint32_t byte_len, qp_num, imm;
	unsigned int flags;
};

static int take_ex(struct ibv_cq_ex *cq, struct exwc *out, int want)
{
	struct timespec t0, t;
	struct ibv_poll_cq_attr pa = { 0 };
	int got = 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (got < want) {
		int rc = ibv_start_poll(cq, &pa);
		if (rc == ENOENT) {
			clock_gettime(CLOCK_MONOTONIC, &t);
			if (t.tv_sec - t0.tv_sec > 5)
				break;
			continue;
		}
		if (rc)
			return -rc;
		do {
			struct exwc *w = &out[got++];
			w->wr_id = cq->wr_id;
			w->status = cq->status;
			w->opcode = ibv_wc_read_opcode(cq);
			w->byte_len = ibv_wc_read_byte_len(cq);
			w->qp_num = ibv_wc_read_qp_num(cq);
			w->flags = ibv_wc_read_wc_flags(cq);
			w->imm = (w->flags & IBV_WC_WITH_IMM) ? ntohl(ibv_wc_read_imm_data(cq)) : 0;
		} while (got < want && ibv_next_poll(cq) == 0);
		ibv_end_poll(cq);
	}
	return got;
}

static int nothing_for(struct ibv_cq *cq, int ms)
{
	struct ibv_wc wc;
	usleep(ms * 1000);
	return ibv_poll_cq(cq, 1, &wc) == 0;
}

static int post_recv(struct ibv_qp *qp, uint64_t id, void *addr, uint32_t len, uint32_t lkey)
{
	struct ibv_sge s = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_recv_wr r = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad;
	return ibv_post_recv(qp, &r, &bad);
}

static int write_wr(struct ibv_qp *qp, uint64_t id, void *src, uint32_t len, uint32_t lkey, void *dst, uint32_t rkey,
		    enum ibv_wr_opcode op)
{
	struct ibv_sge s = { .addr = (uintptr_t)src, .length = len, .lkey = lkey };
	struct ibv_send_wr w = { .wr_id = id, .sg_list = &s, .num_sge = 1, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;
	w.wr.rdma.remote_addr = (uintptr_t)dst;
	w.wr.rdma.rkey = rkey;
	return ibv_post_send(qp, &w, &bad);
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1 || !(ctx = ibv_open_device(list[0]))) {
		printf("FAIL no device\n");
		return 1;
	}
	ibv_free_device_list(list);
	ibv_query_gid(ctx, 1, 0, &gid);
	pd = ibv_alloc_pd(ctx);
	int all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	struct ibv_mr *m0 = ibv_reg_mr(pd, buf[0], sizeof(buf[0]), all);
	struct ibv_mr *m1 = ibv_reg_mr(pd, buf[1], sizeof(buf[1]), all);
	struct ibv_cq *cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	CHECK(pd && m0 && m1 && cq, "PD, two regions, a CQ");
	struct ibv_wc wc;

	/* ---- ibv_create_qp_ex: what rxe's check_qp_init_attr refuses */
	{
		/* LOCAL_INV, BIND_MW and SEND_WITH_INV are taken (memory windows,
		 * verbs_mw_check.c). */
		uint64_t bad[] = { IBV_QP_EX_WITH_TSO, IBV_QP_EX_WITH_ATOMIC_WRITE, 1ull << 40 };
		const char *names[] = { "TSO", "ATOMIC_WRITE", "bit 40" };
		for (int i = 0; i < 3; i++) {
			errno = 0;
			struct ibv_qp *q = qp_ex(cq, IBV_QP_EX_WITH_SEND | bad[i], 16, 1, 0);
			CHECK(!q && errno == EOPNOTSUPP, "create_qp_ex RC with send_ops %s: NULL/EOPNOTSUPP (errno %d)",
			      names[i], errno);
			if (q)
				ibv_destroy_qp(q);
		}
		struct ibv_qp_init_attr_ex a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
						 .cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 },
						 .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_MAX_TSO_HEADER };
		errno = 0;
		CHECK(!ibv_create_qp_ex(ctx, &a) && errno == EOPNOTSUPP, "create_qp_ex with MAX_TSO_HEADER: NULL/EOPNOTSUPP");
		a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
		a.create_flags = IBV_QP_CREATE_SCATTER_FCS;
		errno = 0;
		CHECK(!ibv_create_qp_ex(ctx, &a) && errno == EOPNOTSUPP, "create_qp_ex with create_flags: NULL/EOPNOTSUPP");
		a.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.send_ops_flags = IBV_QP_EX_WITH_SEND;
		errno = 0;
		CHECK(!ibv_create_qp_ex(ctx, &a) && errno == EINVAL, "create_qp_ex without a PD: NULL/EINVAL");
	}
	{
		struct ibv_qp *q = qp_ex(cq, IBV_QP_EX_WITH_SEND, 16, 1, 0);
		struct ibv_qp_ex *x = q ? ibv_qp_to_qp_ex(q) : NULL;
		CHECK(x && (void *)x == (void *)q && x->qp_base.qp_num == q->qp_num && x->wr_send && x->wr_start &&
			      x->wr_complete && x->wr_abort && x->wr_set_sge && x->wr_set_inline_data &&
			      !x->wr_rdma_write && !x->wr_rdma_read && !x->wr_bind_mw && !x->wr_local_inv &&
			      !x->wr_send_inv,
		      "send_ops SEND: qp_to_qp_ex is the QP; wr_send set, other builders NULL (as rxe)");
		struct ibv_qp *plain = ibv_create_qp(pd, &(struct ibv_qp_init_attr){
			.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } });
		CHECK(plain && ibv_qp_to_qp_ex(plain) == NULL, "qp_to_qp_ex of an ibv_create_qp QP: NULL");
		if (plain)
			ibv_destroy_qp(plain);
		/* Posting before RTS: the batch fails as ibv_post_send does. */
		if (x) {
			ibv_wr_start(x);
			x->wr_id = 1;
			ibv_wr_send(x);
			ibv_wr_set_sge(x, m0->lkey, (uintptr_t)buf[0], 8);
			CHECK(ibv_wr_complete(x) == EINVAL, "wr_complete in RESET: EINVAL");
		}
		if (q)
			ibv_destroy_qp(q);
	}

	/* ---- ibv_create_cq_ex */
	{
		struct ibv_cq_init_attr_ex ca = { .cqe = 16, .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP };
		errno = 0;
		CHECK(!ibv_create_cq_ex(ctx, &ca) && errno == EOPNOTSUPP, "create_cq_ex with COMPLETION_TIMESTAMP: EOPNOTSUPP");
		ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN;
		ca.comp_mask = 1 << 5;
		errno = 0;
		CHECK(!ibv_create_cq_ex(ctx, &ca) && errno == EOPNOTSUPP, "create_cq_ex with an unknown comp_mask: EOPNOTSUPP");
		ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
		ca.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
		errno = 0;
		CHECK(!ibv_create_cq_ex(ctx, &ca) && errno == EOPNOTSUPP, "create_cq_ex IGNORE_OVERRUN: EOPNOTSUPP");
		ca.flags = 0;
		ca.cqe = 0;
		errno = 0;
		CHECK(!ibv_create_cq_ex(ctx, &ca) && errno == EINVAL, "create_cq_ex of 0 entries: EINVAL");
	}
	struct ibv_cq_init_attr_ex ca = { .cqe = 256,
					  .wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM,
					  .comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS,
					  .flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED };
	struct ibv_cq_ex *cx = ibv_create_cq_ex(ctx, &ca);
	CHECK(cx && cx->start_poll && cx->read_byte_len && cx->read_imm_data && cx->read_qp_num && !cx->read_src_qp &&
		      !cx->read_completion_ts && cx->read_opcode && cx->read_wc_flags,
	      "create_cq_ex BYTE_LEN|IMM|QP_NUM: those readers set, SRC_QP and timestamp NULL");
	if (!cx)
		return 1;
	{
		struct ibv_poll_cq_attr pa = { .comp_mask = 1 };
		CHECK(ibv_start_poll(cx, &pa) == EINVAL, "start_poll with attr comp_mask 1: EINVAL");
		pa.comp_mask = 0;
		CHECK(ibv_start_poll(cx, &pa) == ENOENT, "start_poll on an empty CQ: ENOENT");
	}

	/* ---- the ibv_wr_* builders, end to end */
	struct ibv_qp *a = qp_ex(ibv_cq_ex_to_cq(cx), ALL_RC_OPS, 64, 4, 64);
	struct ibv_qp *b = qp_ex(ibv_cq_ex_to_cq(cx), ALL_RC_OPS, 64, 4, 64);
	struct ibv_qp_ex *ax = a ? ibv_qp_to_qp_ex(a) : NULL;
	CHECK(ax && b && connect2(a, b) == 0, "two extended RC QPs on an extended CQ, connected");
	if (!ax)
		return 1;
	memset(buf[1], 0, sizeof(buf[1]));
	for (int i = 0; i < 4096; i++)
		buf[0][i] = (char)(i * 11 + 5);
	int ok = post_recv(b, 701, buf[1] + 20000, 4096, m1->lkey) == 0 && post_recv(b, 702, buf[1] + 30000, 4096, m1->lkey) == 0 &&
		 post_recv(b, 703, buf[1] + 40000, 4096, m1->lkey) == 0;
	struct ibv_sge two[2] = { { .addr = (uintptr_t)buf[0] + 1000, .length = 300, .lkey = m0->lkey },
				  { .addr = (uintptr_t)buf[0] + 3000, .length = 200, .lkey = m0->lkey } };
	char inl1[] = "inline-", inl2[] = "list";
	struct ibv_data_buf dl[2] = { { inl1, 7 }, { inl2, 4 } };
	ibv_wr_start(ax);
	ax->wr_flags = IBV_SEND_SIGNALED;
	ax->wr_id = 1;
	ibv_wr_rdma_write(ax, m1->rkey, (uintptr_t)buf[1] + 100);
	ibv_wr_set_sge(ax, m0->lkey, (uintptr_t)buf[0], 1000);
	ax->wr_id = 2;
	ibv_wr_rdma_write_imm(ax, m1->rkey, (uintptr_t)buf[1] + 2000, htonl(0x11223344));
	ibv_wr_set_inline_data(ax, (void *)"written inline", 14);
	ax->wr_id = 3;
	ibv_wr_send(ax);
	ibv_wr_set_sge_list(ax, 2, two);
	ax->wr_id = 4;
	ibv_wr_send_imm(ax, htonl(0xcafe));
	ibv_wr_set_inline_data_list(ax, 2, dl);
	memset(inl1, 'X', 7); /* inline data was copied at the setter */
	int rc = ibv_wr_complete(ax);
	struct exwc got[16];
	int k = take_ex(cx, got, 7);
	int s1 = 0, s2 = 0, s3 = 0, s4 = 0, r1 = 0, r2 = 0, r3 = 0;
	for (int i = 0; i < k; i++) {
		struct exwc *w = &got[i];
		if (w->status != IBV_WC_SUCCESS)
			continue;
		s1 |= w->wr_id == 1 && w->opcode == IBV_WC_RDMA_WRITE && w->qp_num == a->qp_num;
		s2 |= w->wr_id == 2 && w->opcode == IBV_WC_RDMA_WRITE;
		s3 |= w->wr_id == 3 && w->opcode == IBV_WC_SEND;
		s4 |= w->wr_id == 4 && w->opcode == IBV_WC_SEND;
		r1 |= w->wr_id == 701 && w->opcode == IBV_WC_RECV_RDMA_WITH_IMM && w->imm == 0x11223344 &&
		      (w->flags & IBV_WC_WITH_IMM) && w->qp_num == b->qp_num;
		r2 |= w->wr_id == 702 && w->opcode == IBV_WC_RECV && w->byte_len == 500 && !(w->flags & IBV_WC_WITH_IMM);
		r3 |= w->wr_id == 703 && w->opcode == IBV_WC_RECV && w->byte_len == 11 && w->imm == 0xcafe;
	}
	CHECK(ok && rc == 0 && k == 7 && s1 && s2 && s3 && s4 && r1 && r2 && r3,
	      "one batch of WRITE, WRITE_IMM (inline), SEND (2 SGEs), SEND_IMM (inline list): 7 completions read "
	      "through start/next/end_poll with opcode, byte_len, imm, qp_num, wc_flags (rc %d, got %d)",
	      rc, k);
	CHECK(!memcmp(buf[1] + 100, buf[0], 1000) && !memcmp(buf[1] + 2000, "written inline", 14) &&
		      !memcmp(buf[1] + 30000, buf[0] + 1000, 300) && !memcmp(buf[1] + 30300, buf[0] + 3000, 200) &&
		      !memcmp(buf[1] + 40000, "inline-list", 11),
	      "the batch's data placed: WRITE, inline WRITE_IMM, gathered SEND, inline-list SEND_IMM");
	{
		uint64_t *target = (uint64_t *)(buf[1] + 50000), *old = (uint64_t *)(buf[0] + 50000);
		*target = 100;
		memcpy(buf[1] + 51000, "read me back, wr api", 20);
		ibv_wr_start(ax);
		ax->wr_flags = IBV_SEND_SIGNALED;
		ax->wr_id = 5;
		ibv_wr_rdma_read(ax, m1->rkey, (uintptr_t)buf[1] + 51000);
		ibv_wr_set_sge(ax, m0->lkey, (uintptr_t)buf[0] + 51000, 20);
		ax->wr_id = 6;
		ibv_wr_atomic_fetch_add(ax, m1->rkey, (uintptr_t)target, 23);
		ibv_wr_set_sge(ax, m0->lkey, (uintptr_t)old, 8);
		ax->wr_id = 7;
		ibv_wr_atomic_cmp_swp(ax, m1->rkey, (uintptr_t)target, 123, 7);
		ibv_wr_set_sge(ax, m0->lkey, (uintptr_t)old + 8, 8);
		rc = ibv_wr_complete(ax);
		k = take_ex(cx, got, 3);
		CHECK(rc == 0 && k == 3 && got[0].wr_id == 5 && got[0].opcode == IBV_WC_RDMA_READ && got[0].byte_len == 20 &&
			      got[1].wr_id == 6 && got[1].opcode == IBV_WC_FETCH_ADD && got[2].wr_id == 7 &&
			      got[2].opcode == IBV_WC_COMP_SWAP && got[2].status == IBV_WC_SUCCESS &&
			      !memcmp(buf[0] + 51000, "read me back, wr api", 20) && old[0] == 100 && old[1] == 123 &&
			      *target == 7,
		      "READ, FETCH_ADD, CMP_SWP in one batch: in order, data read, 100+23 then swapped to 7");
	}
	{
		/* Unsignaled requests complete nothing; ibv_poll_cq works on an extended CQ. */
		ibv_wr_start(ax);
		ax->wr_flags = 0;
		ax->wr_id = 8;
		ibv_wr_rdma_write(ax, m1->rkey, (uintptr_t)buf[1] + 60000);
		ibv_wr_set_sge(ax, m0->lkey, (uintptr_t)buf[0], 16);
		ax->wr_flags = IBV_SEND_SIGNALED;
		ax->wr_id = 9;
		ibv_wr_rdma_write(ax, m1->rkey, (uintptr_t)buf[1] + 60016);
		ibv_wr_set_sge(ax, m0->lkey, (uintptr_t)buf[0] + 16, 16);
		rc = ibv_wr_complete(ax);
		CHECK(rc == 0 && wait_wc(ibv_cq_ex_to_cq(cx), &wc) == 1 && wc.wr_id == 9 && wc.status == IBV_WC_SUCCESS &&
			      !memcmp(buf[1] + 60000, buf[0], 32) && nothing_for(ibv_cq_ex_to_cq(cx), 50),
		      "wr_flags 0 then SIGNALED: one completion (ibv_poll_cq on the extended CQ), both placed");
	}

	/* ---- bad batches: all or nothing */
	memset(buf[1] + 61000, 0, 64);
#define STAGE_WRITE(id)                                                             \
	do {                                                                        \
		ax->wr_id = (id);                                                   \
		ibv_wr_rdma_write(ax, m1->rkey, (uintptr_t)buf[1] + 61000);         \
		ibv_wr_set_sge(ax, m0->lkey, (uintptr_t)buf[0], 8);                 \
	} while (0)
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_start(ax);
	STAGE_WRITE(20);
	ibv_wr_abort(ax);
	CHECK(nothing_for(ibv_cq_ex_to_cq(cx), 50) && buf[1][61000] == 0, "wr_abort: nothing posted");
	CHECK(ibv_wr_complete(ax) == EINVAL, "wr_complete after wr_abort: EINVAL");
	CHECK(ibv_wr_complete(ax) == EINVAL, "wr_complete without wr_start: EINVAL");
	char big[80];
	memset(big, 'b', sizeof(big));
	ibv_wr_start(ax);
	STAGE_WRITE(21);
	ax->wr_id = 22;
	ibv_wr_send(ax);
	ibv_wr_set_inline_data(ax, big, 65);
	CHECK(ibv_wr_complete(ax) == ENOSPC && nothing_for(ibv_cq_ex_to_cq(cx), 50) && buf[1][61000] == 0,
	      "inline data of 65 bytes on a QP of max_inline_data 64: ENOSPC, the WRITE before it not posted either");
	{
		struct ibv_sge five[5];
		for (int i = 0; i < 5; i++)
			five[i] = (struct ibv_sge){ .addr = (uintptr_t)buf[0], .length = 8, .lkey = m0->lkey };
		ibv_wr_start(ax);
		ax->wr_id = 23;
		ibv_wr_send(ax);
		ibv_wr_set_sge_list(ax, 5, five);
		CHECK(ibv_wr_complete(ax) == ENOSPC, "5 SGEs on a QP of max_send_sge 4: ENOSPC");
		ibv_wr_start(ax);
		ax->wr_id = 24;
		ibv_wr_atomic_fetch_add(ax, m1->rkey, (uintptr_t)buf[1] + 50000, 1);
		ibv_wr_set_sge_list(ax, 2, five);
		CHECK(ibv_wr_complete(ax) == EINVAL, "an ATOMIC with 2 SGEs: EINVAL");
	}
	ibv_wr_start(ax);
	ax->wr_id = 25;
	ibv_wr_rdma_read(ax, m1->rkey, (uintptr_t)buf[1]);
	ibv_wr_set_inline_data(ax, big, 8);
	CHECK(ibv_wr_complete(ax) == EINVAL, "inline data on a READ: EINVAL");
	ibv_wr_start(ax);
	ibv_wr_set_sge(ax, m0->lkey, (uintptr_t)buf[0], 8);
	CHECK(ibv_wr_complete(ax) == EINVAL, "a setter before any builder: EINVAL");
	ibv_wr_start(ax);
	STAGE_WRITE(26);
	ibv_wr_set_ud_addr(ax, NULL, 1, 0x11111111);
	CHECK(ibv_wr_complete(ax) == EINVAL, "wr_set_ud_addr on an RC QP: EINVAL");
	ibv_wr_start(ax);
	for (int i = 0; i < 65; i++)
		STAGE_WRITE(100 + i);
	CHECK(ibv_wr_complete(ax) == ENOSPC && nothing_for(ibv_cq_ex_to_cq(cx), 50) && buf[1][61000] == 0,
	      "65 requests in one batch on a QP of max_send_wr 64: ENOSPC, none posted");
	ibv_wr_start(ax);
	for (int i = 0; i < 64; i++)
		STAGE_WRITE(200 + i);
	rc = ibv_wr_complete(ax);
	k = take_ex(cx, got, 1);
	int all64 = rc == 0 && k == 1 && got[0].wr_id == 200;
	for (int i = 1; all64 && i < 64; i++)
		all64 = take_ex(cx, got, 1) == 1 && got[0].wr_id == (uint64_t)(200 + i) && got[0].status == IBV_WC_SUCCESS;
	CHECK(all64 && buf[1][61000] == buf[0][0], "64 requests in one batch: 64 completions in order");
#undef STAGE_WRITE
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);

	/* ---- a UD QP through ibv_create_qp_ex and the ibv_wr_* builders:
	 * wr_set_ud_addr names the destination, the extended CQ reads src_qp
	 * and IBV_WC_GRH */
	{
		struct ibv_cq_init_attr_ex ca = { .cqe = 32,
						  .wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM |
							      IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP };
		struct ibv_cq_ex *ux = ibv_create_cq_ex(ctx, &ca);
		struct ibv_cq *uc = ux ? ibv_cq_ex_to_cq(ux) : NULL;
		struct ibv_qp_init_attr_ex a = {
			.send_cq = uc, .recv_cq = uc, .qp_type = IBV_QPT_UD, .pd = pd,
			.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 2, .max_recv_sge = 1,
				 .max_inline_data = 64 },
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE,
		};
		errno = 0;
		CHECK(uc && !ibv_create_qp_ex(ctx, &a) && errno == EOPNOTSUPP,
		      "create_qp_ex UD with send_ops RDMA_WRITE: NULL/EOPNOTSUPP");
		a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
		struct ibv_qp *u1 = uc ? ibv_create_qp_ex(ctx, &a) : NULL, *u2 = uc ? ibv_create_qp_ex(ctx, &a) : NULL;
		struct ibv_qp_attr at = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x0abc0abc };
		int ok = u1 && u2;
		int im = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
		ok = ok && !ibv_modify_qp(u1, &at, im) && !ibv_modify_qp(u2, &at, im);
		at.qp_state = IBV_QPS_RTR;
		ok = ok && !ibv_modify_qp(u1, &at, IBV_QP_STATE) && !ibv_modify_qp(u2, &at, IBV_QP_STATE);
		at.qp_state = IBV_QPS_RTS;
		ok = ok && !ibv_modify_qp(u1, &at, IBV_QP_STATE | IBV_QP_SQ_PSN) &&
		     !ibv_modify_qp(u2, &at, IBV_QP_STATE | IBV_QP_SQ_PSN);
		struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 64 } };
		struct ibv_ah *ah = ok ? ibv_create_ah(pd, &aa) : NULL;
		CHECK(ok && ah, "two UD QPs of create_qp_ex in RTS, an address handle");
		if (ok && ah) {
			struct ibv_qp_ex *x1 = ibv_qp_to_qp_ex(u1);
			ibv_wr_start(x1);
			x1->wr_id = 1;
			ibv_wr_send(x1);
			ibv_wr_set_sge(x1, m0->lkey, (uintptr_t)buf[0], 8);
			CHECK(ibv_wr_complete(x1) == EINVAL, "a UD SEND without wr_set_ud_addr: EINVAL");
			ibv_wr_start(x1);
			ibv_wr_send(x1);
			ibv_wr_set_ud_addr(x1, NULL, u2->qp_num, 0x0abc0abc);
			ibv_wr_set_sge(x1, m0->lkey, (uintptr_t)buf[0], 8);
			CHECK(ibv_wr_complete(x1) == EINVAL, "wr_set_ud_addr with a NULL address handle: EINVAL");
			for (int i = 0; i < 2; i++)
				post_recv(u2, 50 + i, buf[1] + 30000 + 1024 * i, 40 + 512, m1->lkey);
			memcpy(buf[0] + 40000, "datagram via ibv_wr", 20);
			ibv_wr_start(x1);
			x1->wr_id = 60;
			x1->wr_flags = IBV_SEND_SIGNALED;
			ibv_wr_send_imm(x1, htonl(0xfeed));
			ibv_wr_set_ud_addr(x1, ah, u2->qp_num, 0x0abc0abc);
			ibv_wr_set_sge(x1, m0->lkey, (uintptr_t)buf[0] + 40000, 20);
			x1->wr_id = 61;
			ibv_wr_send(x1);
			ibv_wr_set_ud_addr(x1, ah, u2->qp_num, 0x0abc0abc);
			ibv_wr_set_inline_data(x1, "inline datagram", 16);
			int rc = ibv_wr_complete(x1);
			int sends = 0, first = 0, second = 0;
			struct timespec t0, t;
			struct ibv_poll_cq_attr pa = { 0 };
			clock_gettime(CLOCK_MONOTONIC, &t0);
			while (rc == 0 && sends + first + second < 4) {
				clock_gettime(CLOCK_MONOTONIC, &t);
				if (t.tv_sec - t0.tv_sec > 5)
					break;
				if (ibv_start_poll(ux, &pa))
					continue;
				do {
					unsigned flags = ibv_wc_read_wc_flags(ux);
					if (ux->status != IBV_WC_SUCCESS)
						continue;
					if (ux->wr_id == 60 || ux->wr_id == 61)
						sends++;
					if (ux->wr_id == 50)
						first = ibv_wc_read_byte_len(ux) == 60 && (flags & IBV_WC_GRH) &&
							(flags & IBV_WC_WITH_IMM) && ntohl(ibv_wc_read_imm_data(ux)) == 0xfeed &&
							ibv_wc_read_src_qp(ux) == u1->qp_num &&
							!memcmp(buf[1] + 30000 + 40, "datagram via ibv_wr", 20);
					if (ux->wr_id == 51)
						second = ibv_wc_read_byte_len(ux) == 56 && (flags & IBV_WC_GRH) &&
							 ibv_wc_read_src_qp(ux) == u1->qp_num &&
							 !memcmp(buf[1] + 31024 + 40, "inline datagram", 16);
				} while (ibv_next_poll(ux) == 0);
				ibv_end_poll(ux);
			}
			CHECK(rc == 0 && sends == 2 && first && second,
			      "a batch of a UD SEND_WITH_IMM (SGE) and an inline SEND: received behind the GRH, "
			      "src_qp and IBV_WC_GRH through the extended CQ (rc %d, sends %d, %d %d)",
			      rc, sends, first, second);
			ibv_destroy_ah(ah);
		}
		if (u1)
			ibv_destroy_qp(u1);
		if (u2)
			ibv_destroy_qp(u2);
		if (uc)
			ibv_destroy_cq(uc);
	}

	/* ---- ibv_resize_cq */
	{
		struct ibv_cq *small = ibv_create_cq(ctx, 4, NULL, NULL, 0);
		struct ibv_qp *q1 = small ? qp_ex(small, 0, 64, 1, 0) : NULL, *q2 = small ? qp_ex(small, 0, 64, 1, 0) : NULL;
		/* comp_mask IBV_QP_INIT_ATTR_PD alone: verbs.h's ibv_create_qp_ex
		 * calls ibv_create_qp, so the QP is not an extended one. */
		CHECK(q1 && q2 && connect2(q1, q2) == 0 && ibv_qp_to_qp_ex(q1) == NULL,
		      "a pair on a CQ of 4 (create_qp_ex with comp_mask PD alone: a plain QP, qp_to_qp_ex NULL)");
		for (int i = 0; i < 3; i++)
			write_wr(q1, 300 + i, buf[0], 8, m0->lkey, buf[1] + 62000, m1->rkey, IBV_WR_RDMA_WRITE);
		usleep(200000);
		CHECK(ibv_resize_cq(small, 2) == EINVAL && small->cqe == 4, "resize_cq to 2 with 3 completions queued: EINVAL");
		CHECK(ibv_resize_cq(small, 0) == EINVAL, "resize_cq to 0: EINVAL");
		struct ibv_device_attr da;
		ibv_query_device(ctx, &da);
		CHECK(ibv_resize_cq(small, da.max_cqe + 1) == EINVAL, "resize_cq to max_cqe + 1: EINVAL");
		char foreign[256] = { 0 };
		CHECK(ibv_resize_cq((struct ibv_cq *)foreign, 8) == EINVAL, "resize_cq of a foreign CQ: EINVAL");
		CHECK(ibv_resize_cq(small, 64) == 0 && small->cqe == 64, "resize_cq to 64: 0, cqe 64");
		for (int i = 3; i < 40; i++)
			write_wr(q1, 300 + i, buf[0], 8, m0->lkey, buf[1] + 62000, m1->rkey, IBV_WR_RDMA_WRITE);
		usleep(200000);
		int order = 1;
		for (int i = 0; order && i < 40; i++)
			order = wait_wc(small, &wc) == 1 && wc.wr_id == (uint64_t)(300 + i) && wc.status == IBV_WC_SUCCESS;
		struct ibv_async_event ae;
		int fl = fcntl(ctx->async_fd, F_GETFL);
		fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
		int overrun = 0;
		while (ibv_get_async_event(ctx, &ae) == 0) {
			overrun |= ae.event_type == IBV_EVENT_CQ_ERR && ae.element.cq == small;
			ibv_ack_async_event(&ae);
		}
		fcntl(ctx->async_fd, F_SETFL, fl);
		CHECK(order && !overrun, "after the resize: the 3 queued then 37 more completions, in order, no CQ overrun");
		CHECK(ibv_resize_cq(small, 8) == 0 && small->cqe == 8, "resize_cq down to 8 once drained: 0");
		write_wr(q1, 400, buf[0], 8, m0->lkey, buf[1] + 62000, m1->rkey, IBV_WR_RDMA_WRITE);
		CHECK(wait_wc(small, &wc) == 1 && wc.wr_id == 400, "the shrunk CQ completes");
		ibv_destroy_qp(q1);
		ibv_destroy_qp(q2);
		ibv_destroy_cq(small);
	}

	/* ---- ibv_rereg_mr */
	{
		static char rb[3][8192] __attribute__((aligned(4096)));
		char foreign[256] = { 0 };
		struct ibv_mr *m = ibv_reg_mr(pd, rb[0], sizeof(rb[0]), all);
		errno = 0;
		CHECK(ibv_rereg_mr((struct ibv_mr *)foreign, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, all) ==
			      IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
		      "rereg_mr of a foreign region: IBV_REREG_MR_ERR_INPUT/EINVAL");
		errno = 0;
		CHECK(ibv_rereg_mr(m, 8, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
		      "rereg_mr with flag 8: ERR_INPUT/EINVAL");
		errno = 0;
		CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, rb[1], 0, 0) == IBV_REREG_MR_ERR_INPUT &&
			      errno == EINVAL,
		      "rereg_mr CHANGE_TRANSLATION of 0 bytes: ERR_INPUT/EINVAL");
		errno = 0;
		CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, IBV_ACCESS_LOCAL_WRITE) == IBV_REREG_MR_ERR_INPUT &&
			      errno == EINVAL,
		      "rereg_mr with access but no CHANGE_ACCESS: ERR_INPUT/EINVAL");
		errno = 0;
		CHECK(ibv_rereg_mr(m, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_CMD && errno == EINVAL,
		      "rereg_mr with no flag: ERR_CMD/EINVAL");
		errno = 0;
		CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_REMOTE_WRITE) ==
			      IBV_REREG_MR_ERR_CMD && errno == EINVAL,
		      "rereg_mr to REMOTE_WRITE without LOCAL_WRITE: ERR_CMD/EINVAL");
		errno = 0;
		CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ZERO_BASED) ==
			      IBV_REREG_MR_ERR_CMD && errno == EOPNOTSUPP,
		      "rereg_mr to ZERO_BASED access: ERR_CMD/EOPNOTSUPP");
		errno = 0;
		CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_PD, (struct ibv_pd *)foreign, NULL, 0, 0) == IBV_REREG_MR_ERR_CMD &&
			      errno == EINVAL,
		      "rereg_mr to a foreign PD: ERR_CMD/EINVAL");
		struct ibv_qp *q1, *q2;
		uint32_t old_rkey = m->rkey;
		/* ACCESS: remote READ only. */
		CHECK(ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) == 0 &&
			      m->rkey != old_rkey && m->addr == rb[0] && m->pd == pd,
		      "rereg_mr CHANGE_ACCESS to LOCAL_WRITE|REMOTE_READ: 0, new keys");
		q1 = qp_ex(cq, 0, 16, 1, 0);
		q2 = qp_ex(cq, 0, 16, 1, 0);
		memcpy(rb[0] + 64, "after rereg", 11);
		ok = connect2(q1, q2) == 0 &&
		     write_wr(q1, 500, buf[0] + 100, 11, m0->lkey, rb[0] + 64, m->rkey, IBV_WR_RDMA_READ) == 0 &&
		     wait_wc(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && !memcmp(buf[0] + 100, "after rereg", 11);
		CHECK(ok, "a READ with the new rkey: data read");
		ok = write_wr(q1, 501, buf[0], 8, m0->lkey, rb[0], m->rkey, IBV_WR_RDMA_WRITE) == 0 && wait_wc(cq, &wc) == 1 &&
		     wc.status == IBV_WC_REM_ACCESS_ERR;
		CHECK(ok, "a WRITE with the new rkey, no REMOTE_WRITE any more: IBV_WC_REM_ACCESS_ERR (%s)",
		      ibv_wc_status_str(wc.status));
		while (ibv_poll_cq(cq, 1, &wc) == 1)
			;
		ibv_destroy_qp(q1);
		ibv_destroy_qp(q2);
		q1 = qp_ex(cq, 0, 16, 1, 0);
		q2 = qp_ex(cq, 0, 16, 1, 0);
		ok = connect2(q1, q2) == 0 &&
		     write_wr(q1, 502, buf[0], 8, m0->lkey, rb[0], old_rkey, IBV_WR_RDMA_READ) == 0 && wait_wc(cq, &wc) == 1 &&
		     wc.status == IBV_WC_REM_ACCESS_ERR;
		CHECK(ok, "a READ with the old rkey: IBV_WC_REM_ACCESS_ERR");
		while (ibv_poll_cq(cq, 1, &wc) == 1)
			;
		ibv_destroy_qp(q1);
		ibv_destroy_qp(q2);
		/* PD: a region of another PD, moved into the QPs' PD. */
		struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
		struct ibv_mr *mp = ibv_reg_mr(pd2, rb[1], sizeof(rb[1]), all);
		q1 = qp_ex(cq, 0, 16, 1, 0);
		q2 = qp_ex(cq, 0, 16, 1, 0);
		ok = connect2(q1, q2) == 0 && write_wr(q1, 503, buf[0], 8, m0->lkey, rb[1], mp->rkey, IBV_WR_RDMA_WRITE) == 0 &&
		     wait_wc(cq, &wc) == 1 && wc.status == IBV_WC_REM_ACCESS_ERR;
		CHECK(ok, "a WRITE to a region of another PD: IBV_WC_REM_ACCESS_ERR");
		while (ibv_poll_cq(cq, 1, &wc) == 1)
			;
		ibv_destroy_qp(q1);
		ibv_destroy_qp(q2);
		CHECK(ibv_rereg_mr(mp, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0) == 0 && mp->pd == pd,
		      "rereg_mr CHANGE_PD into the QPs' PD: 0, mr->pd updated");
		CHECK(ibv_dealloc_pd(pd2) == 0, "the old PD holds nothing any more: dealloc_pd 0");
		q1 = qp_ex(cq, 0, 16, 1, 0);
		q2 = qp_ex(cq, 0, 16, 1, 0);
		memset(rb[1], 0, 16);
		ok = connect2(q1, q2) == 0 && write_wr(q1, 504, buf[0], 8, m0->lkey, rb[1], mp->rkey, IBV_WR_RDMA_WRITE) == 0 &&
		     wait_wc(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && !memcmp(rb[1], buf[0], 8);
		CHECK(ok, "the same WRITE after CHANGE_PD: placed");
		/* TRANSLATION: the region moves to rb[2]. */
		CHECK(ibv_rereg_mr(mp, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, rb[2] + 4096, 4096, 0) == 0 &&
			      mp->addr == rb[2] + 4096 && mp->length == 4096,
		      "rereg_mr CHANGE_TRANSLATION to 4096 bytes elsewhere: 0, addr and length updated");
		memset(rb[2], 0, sizeof(rb[2]));
		ok = write_wr(q1, 505, buf[0], 16, m0->lkey, rb[2] + 4096 + 10, mp->rkey, IBV_WR_RDMA_WRITE) == 0 &&
		     wait_wc(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && !memcmp(rb[2] + 4106, buf[0], 16);
		CHECK(ok, "a WRITE into the new range: placed");
		ok = write_wr(q1, 506, buf[0], 16, m0->lkey, rb[1], mp->rkey, IBV_WR_RDMA_WRITE) == 0 && wait_wc(cq, &wc) == 1 &&
		     wc.status == IBV_WC_REM_ACCESS_ERR;
		CHECK(ok, "a WRITE into the old range: IBV_WC_REM_ACCESS_ERR");
		while (ibv_poll_cq(cq, 1, &wc) == 1)
			;
		ibv_destroy_qp(q1);
		ibv_destroy_qp(q2);
		CHECK(ibv_dereg_mr(m) == 0 && ibv_dereg_mr(mp) == 0, "dereg_mr of both reregistered regions");
	}

	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cx)) == 0, "destroy_cq of the extended CQ");
	CHECK(ibv_dereg_mr(m0) == 0 && ibv_dereg_mr(m1) == 0 && ibv_destroy_cq(cq) == 0 && ibv_dealloc_pd(pd) == 0 &&
		      ibv_close_device(ctx) == 0,
	      "tear down");
	printf("verbs_ex_check: %s (%d failed)\n", failures ? "FAILED" : "all passed", failures);
	return failures ? 1 : 0;
}
