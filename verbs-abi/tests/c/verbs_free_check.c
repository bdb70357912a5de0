/*
 * Registered memory that outlives the program's mistakes (issue 44, item
 * 1), seen from C: compiled against the system's verbs.h, run preloaded on
 * a looped-back net_ring0 port by scripts/verbs-abi.sh ("abi" part). Two RC
 * QPs of this process are connected to each other through the NIC's
 * loopback: QP a is the peer, QP b owns the "victim" regions.
 *
 * The program frees (free, munmap) registered buffers while the peer
 * WRITEs, READs and does atomics on their rkeys, before and while the
 * operations are in flight: the process must not crash and every operation
 * must complete with success (the engine's own mapping of the pages, as a
 * pinned hardware NIC keeps its pages) or an access error, never a fault;
 * the engine keeps the bytes (a READ after the free returns what the
 * WRITE before it put, fetch-and-add counts on). Also: ibv_dereg_mr
 * releases the engine's mapping; a range mapped again at the same address
 * and registered while the old region lives gets the program's new bytes;
 * two regions on one page share it; unmapped, PROT_NONE and read-only
 * ranges with write access are EFAULT, read-only with read access only
 * works; a MAP_SHARED buffer (not moved) works; a forked child gets a
 * private copy of registered pages; ibv_rereg_mr with a new translation
 * whose buffer is then freed; a range registered, deregistered, registered
 * again and unmapped.
 * Exits 0 only if every check passed; prints one line per check.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#define LEN (64 * 1024)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;
static struct ibv_cq *cq;
static struct ibv_qp *qa, *qb;
/* The peer's local buffer (QP a's): 0..LEN source, LEN.. READ/atomic targets. */
static char *local;
static struct ibv_mr *local_mr;

static int modify(struct ibv_qp *a, struct ibv_qp *b, uint32_t psn_a, uint32_t psn_b)
{
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = b->qp_num,
				 .rq_psn = psn_b, .max_dest_rd_atomic = 16, .min_rnr_timer = 12,
				 .ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 1 } } };
	int rm = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	struct ibv_qp_attr s = { .qp_state = IBV_QPS_RTS, .sq_psn = psn_a, .timeout = 14, .retry_cnt = 7,
				 .rnr_retry = 7, .max_rd_atomic = 16 };
	int sm = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		 IBV_QP_MAX_QP_RD_ATOMIC;
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

static struct ibv_qp *rc_qp(void)
{
	struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = { .max_send_wr = 256, .max_recv_wr = 16, .max_send_sge = 1,
					       .max_recv_sge = 1 } };
	return ibv_create_qp(pd, &a);
}

/* Polls `n` completions within 10 s; counts them by status. */
static int reap(int n, int *ok, int *access_err, int *other)
{
	struct timespec t0, t;
	struct ibv_wc wc[32];
	int got = 0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (got < n) {
		int k = ibv_poll_cq(cq, 32, wc);
		for (int i = 0; i < k; i++) {
			if (wc[i].status == IBV_WC_SUCCESS)
				(*ok)++;
			else if (wc[i].status == IBV_WC_REM_ACCESS_ERR)
				(*access_err)++;
			else {
				(*other)++;
				printf("  wc status %s (%d) wr_id %lu\n", ibv_wc_status_str(wc[i].status),
				       wc[i].status, (unsigned long)wc[i].wr_id);
			}
		}
		got += k;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 10)
			break;
	}
	return got;
}

/* Posts one operation from QP a on (rkey, raddr): 0 WRITE of len bytes from
 * local+loff, 1 READ of len bytes into local+loff, 2 FETCH_ADD of 1, 3
 * CMP_SWAP (compare 0, swap 7), each atomic's result at local+loff. */
static int post(int kind, uint32_t rkey, uint64_t raddr, size_t loff, uint32_t len, uint64_t id)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(local + loff), .length = len, .lkey = local_mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .send_flags = IBV_SEND_SIGNALED }, *bad;
	switch (kind) {
	case 0:
		wr.opcode = IBV_WR_RDMA_WRITE;
		break;
	case 1:
		wr.opcode = IBV_WR_RDMA_READ;
		break;
	case 2:
		wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
		sge.length = 8;
		wr.wr.atomic.compare_add = 1;
		break;
	default:
		wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
		sge.length = 8;
		wr.wr.atomic.compare_add = 0;
		wr.wr.atomic.swap = 7;
		break;
	}
	if (kind <= 1) {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	} else {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
	}
	return ibv_post_send(qa, &wr, &bad);
}

/* One operation, waited for: 1 if it completed with success. */
static int one(int kind, uint32_t rkey, uint64_t raddr, size_t loff, uint32_t len)
{
	int ok = 0, acc = 0, other = 0;
	if (post(kind, rkey, raddr, loff, len, kind))
		return 0;
	reap(1, &ok, &acc, &other);
	return ok == 1;
}

static const int access_all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			      IBV_ACCESS_REMOTE_ATOMIC;

/* Lines of /proc/self/maps naming rsnic's memfds. */
static int memfd_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int n = 0;
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f))
		if (strstr(line, "memfd:rsnic-mr"))
			n++;
	fclose(f);
	return n;
}

/*
 * A victim region of LEN bytes (mmap'd, or malloc'd when `heap`), written
 * with a pattern and freed while the peer works on it: first with the
 * operations done before the free and checked after it, then with a burst
 * of 192 operations posted just before the free and reaped after it.
 */
static void freed_while_in_use(int heap)
{
	const char *what = heap ? "malloc'd (free)" : "mmap'd (munmap)";
	char *v = heap ? malloc(LEN + 96) + 96 : mmap(NULL, LEN, PROT_READ | PROT_WRITE,
							   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	for (int i = 0; i < LEN; i++)
		v[i] = (char)(i * 7);
	struct ibv_mr *mr = ibv_reg_mr(pd, v, LEN, access_all);
	CHECK(mr != NULL, "%s: registered (errno %d)", what, mr ? 0 : errno);
	if (!mr)
		return;
	CHECK(memcmp(v, (char[]){ 0, 7, 14, 21 }, 4) == 0 && v[LEN - 1] == (char)((LEN - 1) * 7),
	      "%s: the program's bytes are kept by the registration", what);
	uint64_t va = (uintptr_t)v;
	/* Before the free: READ what the program wrote. */
	memset(local + LEN, 0, LEN);
	int r = one(1, mr->rkey, va, LEN, LEN);
	CHECK(r && memcmp(local + LEN, v, LEN) == 0, "%s: READ before the free sees the program's bytes", what);
	/* A WRITE of a new pattern and an atomic, then the free. */
	for (int i = 0; i < LEN; i++)
		local[i] = (char)(i * 13 + 1);
	int w = one(0, mr->rkey, va, 0, LEN);
	CHECK(w && memcmp(v, local, LEN) == 0, "%s: the program sees the peer's WRITE", what);
	memset(v + 64, 0, 8);
	if (heap)
		free(v - 96);
	else
		munmap(v, LEN);
	/* After the free: READ, WRITE, atomics on the rkey. The engine keeps
	 * the bytes: READ returns the WRITE's, fetch-and-add counts. */
	memset(local + LEN, 0, LEN);
	r = one(1, mr->rkey, va, LEN, LEN);
	int diff = -1;
	for (int i = 128; i < LEN - 64 && diff < 0; i++)
		if (local[LEN + i] != local[i])
			diff = i;
	CHECK(r && diff < 0, "%s: READ after the free completes with the bytes written before (first difference at %d)",
	      what, diff);
	uint64_t *res = (uint64_t *)(local + 2 * LEN);
	int fa1 = one(2, mr->rkey, va + 64, 2 * LEN, 8);
	uint64_t first = *res;
	int fa2 = one(2, mr->rkey, va + 64, 2 * LEN, 8);
	CHECK(fa1 && fa2 && first == 0 && *res == 1, "%s: FETCH_ADD after the free: 0 then 1 (got %lu)", what,
	      (unsigned long)*res);
	int cs = one(3, mr->rkey, va + 128, 2 * LEN, 8);
	CHECK(cs, "%s: CMP_SWAP after the free completes", what);
	for (int i = 0; i < LEN; i++)
		local[i] = (char)(i * 3);
	w = one(0, mr->rkey, va, 0, LEN);
	memset(local + LEN, 0, LEN);
	r = one(1, mr->rkey, va, LEN, LEN);
	CHECK(w && r && memcmp(local + LEN, local, LEN) == 0, "%s: WRITE then READ after the free round-trip", what);
	CHECK(ibv_dereg_mr(mr) == 0, "%s: dereg after the free", what);

	/* Freed while the operations are in flight. */
	v = heap ? malloc(LEN + 96) + 96
		 : mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(v, 1, LEN);
	mr = ibv_reg_mr(pd, v, LEN, access_all);
	if (!mr) {
		CHECK(0, "%s: registered again", what);
		return;
	}
	va = (uintptr_t)v;
	int posted = 0;
	for (int i = 0; i < 192; i++) {
		int kind = i % 4;
		uint64_t at = kind >= 2 ? va + 8 * (i % 64) : va + 1024 * (i % 32);
		size_t loff = kind >= 2 ? 2 * LEN + 8 * (i % 64) : (size_t)LEN + 1024 * (i % 32);
		if (post(kind, mr->rkey, at, kind == 0 ? 0 : loff, kind >= 2 ? 8 : 1024, i) == 0)
			posted++;
		if (i == 8) {
			if (heap)
				free(v - 96);
			else
				munmap(v, LEN);
		}
	}
	int ok = 0, acc = 0, other = 0;
	int got = reap(posted, &ok, &acc, &other);
	CHECK(got == posted && other == 0 && ok + acc == posted,
	      "%s: %d operations in flight across the free: %d success, %d access errors, %d other", what,
	      posted, ok, acc, other);
	CHECK(ibv_dereg_mr(mr) == 0, "%s: dereg after the free in flight", what);
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1 || !(ctx = ibv_open_device(list[0]))) {
		printf("FAIL no device\n");
		return 1;
	}
	ibv_query_gid(ctx, 1, 0, &gid);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 512, NULL, NULL, 0);
	qa = rc_qp();
	qb = rc_qp();
	CHECK(pd && cq && connect2(qa, qb) == 0, "two RC QPs connected through the loopback");
	local = aligned_alloc(4096, 3 * LEN);
	local_mr = ibv_reg_mr(pd, local, 3 * LEN, access_all);
	CHECK(local_mr != NULL, "the peer's buffer registered");
	if (!local_mr)
		return 1;
	int maps0 = memfd_maps();

	freed_while_in_use(0);
	/* The unmapped regions' engine mappings went with their dereg: only
	 * the peer buffer's remain (its program view and engine view). */
	CHECK(memfd_maps() == maps0, "ibv_dereg_mr released the engine's mappings (%d memfd mappings, %d before)",
	      memfd_maps(), maps0);
	freed_while_in_use(1);

	/* Unmapped, mapped again at the same address and registered while the
	 * old region still lives: each region has its own bytes. */
	char *v = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(v, 'o', 4 * 4096);
	struct ibv_mr *old = ibv_reg_mr(pd, v, 4 * 4096, access_all);
	munmap(v, 4 * 4096);
	char *v2 = mmap(v, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (v2 == v) {
		memset(v2, 'n', 4 * 4096);
		struct ibv_mr *fresh = ibv_reg_mr(pd, v2, 4 * 4096, access_all);
		memset(local + LEN, 0, 2 * 4096);
		int r1 = fresh && one(1, fresh->rkey, (uintptr_t)v2, LEN, 4096);
		int r2 = old && one(1, old->rkey, (uintptr_t)v, LEN + 4096, 4096);
		CHECK(r1 && r2 && local[LEN] == 'n' && local[LEN + 4096] == 'o',
		      "a range mapped again at the same address: the new region reads the new bytes ('%c'), the "
		      "old one its own ('%c')",
		      local[LEN], local[LEN + 4096]);
		memset(local, 'w', 4096);
		CHECK(fresh && one(0, fresh->rkey, (uintptr_t)v2, 0, 4096) && v2[0] == 'w' && v2[4095] == 'w',
		      "the program sees a WRITE through the new region");
		if (fresh)
			ibv_dereg_mr(fresh);
		munmap(v2, 4 * 4096);
	} else {
		CHECK(1, "(the address was taken again: the re-registration case skipped)");
	}
	if (old)
		ibv_dereg_mr(old);

	/* Two regions on one page (and one more across it) share its bytes. */
	char *p = aligned_alloc(4096, 3 * 4096);
	memset(p, 0, 3 * 4096);
	struct ibv_mr *m1 = ibv_reg_mr(pd, p + 100, 200, access_all);
	struct ibv_mr *m2 = ibv_reg_mr(pd, p + 150, 4096, access_all);
	struct ibv_mr *m3 = ibv_reg_mr(pd, p, 3 * 4096, access_all);
	memset(local, 'x', 50);
	int w1 = m1 && one(0, m1->rkey, (uintptr_t)(p + 150), 0, 50);
	memset(local + LEN, 0, 64);
	int r2 = m2 && one(1, m2->rkey, (uintptr_t)(p + 150), LEN, 50);
	int r3 = m3 && one(1, m3->rkey, (uintptr_t)(p + 150), LEN + 64, 50);
	CHECK(w1 && r2 && r3 && p[150] == 'x' && p[199] == 'x' && p[200] == 0 && local[LEN] == 'x' &&
		      local[LEN + 64 + 49] == 'x',
	      "overlapping regions on one page see one another's WRITE, and so does the program");
	p[3000] = 'q';
	r2 = m2 && one(1, m2->rkey, (uintptr_t)(p + 3000), LEN, 1);
	CHECK(r2 && local[LEN] == 'q', "a program store after registration is seen through the region");
	if (m1)
		ibv_dereg_mr(m1);
	if (m2)
		ibv_dereg_mr(m2);
	p[4000] = 'z';
	r3 = m3 && one(1, m3->rkey, (uintptr_t)(p + 4000), LEN, 1);
	CHECK(r3 && local[LEN] == 'z', "the third region keeps the page after the other two left");
	if (m3)
		ibv_dereg_mr(m3);

	/* Refused ranges, as the kernel's pinning refuses them. */
	char *u = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(u + 4096, 4096);
	errno = 0;
	CHECK(!ibv_reg_mr(pd, u, 8192, access_all) && errno == EFAULT, "a range with an unmapped page: EFAULT (%d)",
	      errno);
	mprotect(u, 4096, PROT_NONE);
	errno = 0;
	CHECK(!ibv_reg_mr(pd, u, 100, IBV_ACCESS_REMOTE_READ) && errno == EFAULT, "PROT_NONE: EFAULT (%d)", errno);
	mprotect(u, 4096, PROT_READ);
	errno = 0;
	CHECK(!ibv_reg_mr(pd, u, 100, access_all) && errno == EFAULT, "read-only with write access: EFAULT (%d)",
	      errno);
	struct ibv_mr *ro = ibv_reg_mr(pd, u, 100, IBV_ACCESS_REMOTE_READ);
	int rr = ro && one(1, ro->rkey, (uintptr_t)u, LEN, 100);
	CHECK(rr, "read-only with read access only: registered and READ");
	if (ro)
		ibv_dereg_mr(ro);
	munmap(u, 4096);

	/* A MAP_SHARED buffer is not moved: the program's own pages. */
	char *sh = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	struct ibv_mr *shm = ibv_reg_mr(pd, sh, 4096, access_all);
	memset(local, 's', 16);
	CHECK(shm && one(0, shm->rkey, (uintptr_t)sh, 0, 16) && sh[15] == 's',
	      "a MAP_SHARED buffer (not moved) registered and written");
	if (shm)
		ibv_dereg_mr(shm);
	munmap(sh, 4096);

	/* fork(): the child gets a private copy of registered pages. */
	char *f = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(f, 'p', 4096);
	struct ibv_mr *fm = ibv_reg_mr(pd, f, 4096, access_all);
	pid_t pid = fork();
	if (pid == 0) {
		int saw = f[10] == 'p';
		memset(f, 'c', 4096);
		_exit(saw ? 0 : 3);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	memset(local + LEN, 0, 16);
	int fr = fm && one(1, fm->rkey, (uintptr_t)f, LEN, 16);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && f[0] == 'p' && fr && local[LEN] == 'p',
	      "a forked child sees the registered bytes and its writes stay its own (parent '%c', status %d)", f[0],
	      st);
	if (fm)
		ibv_dereg_mr(fm);

	/* Registered, deregistered, registered again, then unmapped: the second
	 * registration moves the pages again (they are still on the first
	 * one's memfd), so the engine still has them. */
	char *g = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	memset(g, 'g', 8192);
	struct ibv_mr *g1 = ibv_reg_mr(pd, g, 8192, access_all);
	if (g1)
		ibv_dereg_mr(g1);
	struct ibv_mr *g2 = ibv_reg_mr(pd, g, 8192, access_all);
	munmap(g, 8192);
	memset(local + LEN, 0, 8192);
	int gr = g2 && one(1, g2->rkey, (uintptr_t)g, LEN, 8192);
	CHECK(gr && local[LEN] == 'g' && local[LEN + 8191] == 'g',
	      "registered, deregistered, registered again and unmapped: READ completes with the bytes");
	if (g2)
		ibv_dereg_mr(g2);

	/* ibv_rereg_mr to a new buffer, which the program then frees. */
	char *a1 = malloc(LEN), *a2 = malloc(LEN);
	uintptr_t a2va = (uintptr_t)a2; /* used after free(a2) on purpose */
	struct ibv_mr *rm = ibv_reg_mr(pd, a1, LEN, access_all);
	int rc = rm ? ibv_rereg_mr(rm, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, a2, LEN, 0) : -1;
	free(a2);
	memset(local, 'r', 64);
	int rw = rc == 0 && one(0, rm->rkey, a2va, 0, 64);
	memset(local + LEN, 0, 64);
	int rd = rc == 0 && one(1, rm->rkey, a2va, LEN, 64);
	CHECK(rc == 0 && rw && rd && local[LEN + 63] == 'r',
	      "ibv_rereg_mr to a buffer then freed: WRITE and READ complete (rc %d)", rc);
	if (rm)
		ibv_dereg_mr(rm);
	free(a1);

	ibv_destroy_qp(qa);
	ibv_destroy_qp(qb);
	ibv_dereg_mr(local_mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("%s\n", failures ? "FAILED" : "all passed");
	return failures ? 1 : 0;
}
