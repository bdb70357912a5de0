/*
 * Lifetimes, races and process hygiene of librsnic_verbs.so (issue 44,
 * items 2-4), seen from C as a program sees them: compiled against the
 * system's <infiniband/verbs.h>, linked with -libverbs, run preloaded on a
 * looped-back net_ring0 (scripts/verbs-abi.sh, "abi" part; also built with
 * -fsanitize=address there, so that a CQ pointer handed out after its
 * destroy is caught when this program reads it).
 *
 *   verbs_stress [OPS [RACES]]
 *
 * 1. hygiene: the library's threads (at most 2 besides the program's), every
 *    descriptor close-on-exec, ibv_close_device with live children (0; freed with the last)
 *    (-1/EBUSY), ibv_reg_mr over unmapped memory (NULL/EFAULT),
 *    ibv_query_qp reporting an ERR the engine entered by itself;
 * 2. ibv_destroy_cq waits for ibv_ack_cq_events (ibv_get_cq_event(3));
 * 3. stress: 8 threads, OPS verbs in all (default 100000): PDs, MRs, CQs and
 *    QPs created and destroyed, QPs on two shared CQs in opposite orders
 *    (A,B) and (B,A), parents refusing with EBUSY while children live, two
 *    threads destroying the same object at once (one 0, one EINVAL), and two
 *    threads posting and polling all along;
 * 4. RACES rounds (default 10000) of ibv_get_cq_event racing ibv_destroy_cq
 *    from two threads: the destroy returns 0 or EBUSY, the event names the
 *    live CQ or nothing;
 * 5. fork() after opening the device: the child's verbs fail (EIO), it
 *    exits without hanging, and the parent's traffic goes on.
 * Exits 0 only if every check passed; prints one line per check.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <syslog.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_mr *mr;
static union ibv_gid gid;
static char buf[1 << 16] __attribute__((aligned(4096)));

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static struct ibv_qp *rc_qp(struct ibv_pd *p, struct ibv_cq *scq, struct ibv_cq *rcq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	return ibv_create_qp(p, &ia);
}

/* RESET -> INIT -> RTR -> RTS towards QPN `dest` of this device. */
static int connect_to(struct ibv_qp *qp, uint32_t dest)
{
	struct ibv_qp_attr i = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest,
				 .rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
				 .ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 1 } } };
	struct ibv_qp_attr s = { .qp_state = IBV_QPS_RTS, .sq_psn = 0, .timeout = 14, .retry_cnt = 7,
				 .rnr_retry = 7, .max_rd_atomic = 1 };
	return ibv_modify_qp(qp, &i, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) ||
	       ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) ||
	       ibv_modify_qp(qp, &s, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* One signaled 8-byte WRITE from buf+from to buf+to. */
static int write8(struct ibv_qp *qp, size_t from, size_t to)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf + from, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	wr.wr.rdma.remote_addr = (uintptr_t)buf + to;
	wr.wr.rdma.rkey = mr->rkey;
	return ibv_post_send(qp, &wr, &bad);
}

/* One completion within 5 s. */
static int wait_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	double t0 = now();
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
		if (now() - t0 > 5)
			return 0;
	}
}

static int count_threads(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/task");
	for (struct dirent *e; d && (e = readdir(d));)
		n += e->d_name[0] != '.';
	if (d)
		closedir(d);
	return n;
}

/* Descriptors open before ibv_open_device (inherited from whoever started us). */
static char inherited[1024];

/* Descriptors above 2 opened since `inherited` without FD_CLOEXEC (their
 * numbers and targets in `out`). */
static int leaky_fds(char *out, size_t len)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	out[0] = 0;
	for (struct dirent *e; d && (e = readdir(d));) {
		int fd = atoi(e->d_name);
		if (e->d_name[0] == '.' || fd <= 2 || fd == dirfd(d) || (fd < 1024 && inherited[fd]))
			continue;
		int fl = fcntl(fd, F_GETFD);
		if (fl >= 0 && !(fl & FD_CLOEXEC)) {
			char link[64] = "", path[64];
			snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
			ssize_t l = readlink(path, link, sizeof(link) - 1);
			if (l > 0)
				link[l] = 0;
			size_t used = strlen(out);
			snprintf(out + used, len - used, " %d=%s", fd, link);
			n++;
		}
	}
	if (d)
		closedir(d);
	return n;
}

static void *ack_later(void *cq)
{
	usleep(300000);
	ibv_ack_cq_events(cq, 1);
	return NULL;
}

/* ------------------------------------------------------------ the stress */

static atomic_long ops;
static long ops_target;
static atomic_int stress_fail;
static struct ibv_cq *shared_a, *shared_b;
static pthread_barrier_t pair_barrier;
static struct ibv_cq *_Atomic victim;
static int pair_rc[2];

#define EXPECT(cond, what)                                                                             \
	do {                                                                                           \
		if (!(cond)) {                                                                         \
			if (atomic_fetch_add(&stress_fail, 1) < 10)                                    \
				printf("  stress: thread %d: %s (errno %d)\n", id, what, errno);      \
		}                                                                                      \
	} while (0)

static void *churn(void *arg)
{
	int id = (int)(intptr_t)arg;
	while (atomic_load(&ops) < ops_target) {
		struct ibv_pd *p = ibv_alloc_pd(ctx);
		struct ibv_mr *m = p ? ibv_reg_mr(p, buf, 4096, IBV_ACCESS_LOCAL_WRITE) : NULL;
		struct ibv_cq *c = ibv_create_cq(ctx, 8, NULL, NULL, 0);
		/* Opposite orders on the two shared CQs. */
		struct ibv_qp *q1 = p ? (id & 1 ? rc_qp(p, shared_a, shared_b) : rc_qp(p, shared_b, shared_a)) : NULL;
		struct ibv_qp *q2 = p && c ? rc_qp(p, c, shared_a) : NULL;
		EXPECT(p && m && c && q1 && q2, "create");
		struct ibv_qp_attr i = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
		if (q1)
			EXPECT(ibv_modify_qp(q1, &i, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
							     IBV_QP_ACCESS_FLAGS) == 0,
			       "modify_qp INIT");
		if (p)
			EXPECT(ibv_dealloc_pd(p) == EBUSY, "dealloc_pd with children: EBUSY");
		if (c)
			EXPECT(ibv_destroy_cq(c) == EBUSY, "destroy_cq with a QP: EBUSY");
		EXPECT(ibv_destroy_cq(shared_a) == EBUSY, "destroy_cq of a shared CQ in use: EBUSY");
		EXPECT(!q2 || ibv_destroy_qp(q2) == 0, "destroy_qp");
		EXPECT(!q1 || ibv_destroy_qp(q1) == 0, "destroy_qp");
		EXPECT(!c || ibv_destroy_cq(c) == 0, "destroy_cq");
		EXPECT(!m || ibv_dereg_mr(m) == 0, "dereg_mr");
		EXPECT(!p || ibv_dealloc_pd(p) == 0, "dealloc_pd");
		atomic_fetch_add(&ops, 14);
	}
	return NULL;
}

/* Two threads destroy the same CQ at once: one 0, the other EINVAL. */
static void *double_destroy(void *arg)
{
	int id = (int)(intptr_t)arg, me = id & 1;
	for (;;) {
		if (me == 0)
			atomic_store(&victim, atomic_load(&ops) < ops_target ? ibv_create_cq(ctx, 4, NULL, NULL, 0) : NULL);
		pthread_barrier_wait(&pair_barrier);
		struct ibv_cq *v = atomic_load(&victim);
		if (!v)
			return NULL;
		pair_rc[me] = ibv_destroy_cq(v);
		pthread_barrier_wait(&pair_barrier);
		if (me == 0) {
			int a = pair_rc[0], b = pair_rc[1];
			EXPECT((a == 0 && b == EINVAL) || (a == EINVAL && b == 0), "double destroy_cq: one 0, one EINVAL");
			atomic_fetch_add(&ops, 3);
		}
	}
}

/* Posts and polls all along on a QP of its own (connected to itself). */
static void *poster(void *arg)
{
	int id = (int)(intptr_t)arg;
	struct ibv_cq *c = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp *q = c ? rc_qp(pd, c, id & 1 ? shared_a : shared_b) : NULL;
	EXPECT(q && connect_to(q, q->qp_num) == 0, "poster: a QP connected to itself");
	while (q && atomic_load(&ops) < ops_target) {
		struct ibv_wc wc;
		int ok = write8(q, 1024 + id * 64, 2048 + id * 64) == 0 && wait_wc(c, &wc) == 1 &&
			 wc.status == IBV_WC_SUCCESS;
		EXPECT(ok, "poster: WRITE completes");
		if (!ok)
			break;
		atomic_fetch_add(&ops, 2);
	}
	EXPECT(!q || ibv_destroy_qp(q) == 0, "poster: destroy_qp");
	EXPECT(!c || ibv_destroy_cq(c) == 0, "poster: destroy_cq");
	return NULL;
}

/* ------------------------------------------- get_cq_event vs destroy_cq */

static struct ibv_comp_channel *race_ch;
static pthread_barrier_t race_barrier;
static struct ibv_cq *_Atomic race_cq;
static atomic_int race_got, race_destroy_first, race_busy, race_bad, race_destroyed;

static void *race_getter(void *arg)
{
	(void)arg;
	for (;;) {
		pthread_barrier_wait(&race_barrier);
		struct ibv_cq *want = atomic_load(&race_cq);
		if (!want)
			return NULL;
		double t0 = now();
		for (;;) {
			struct ibv_cq *ev = NULL;
			void *evctx = NULL;
			if (ibv_get_cq_event(race_ch, &ev, &evctx) == 0) {
				/* Read the CQ the library handed out before acking it:
				 * under ASan, a freed one is a heap-use-after-free here. */
				if (ev != want || ev->cq_context != (void *)0xc0ffee || evctx != (void *)0xc0ffee)
					atomic_fetch_add(&race_bad, 1);
				ibv_ack_cq_events(ev, 1);
				atomic_fetch_add(&race_got, 1);
				break;
			}
			if (errno != EAGAIN) {
				atomic_fetch_add(&race_bad, 1);
				break;
			}
			/* The destroy came first: the event went with the CQ. */
			if (atomic_load(&race_destroyed) || now() - t0 > 5) {
				atomic_fetch_add(&race_destroy_first, 1);
				break;
			}
		}
		pthread_barrier_wait(&race_barrier);
	}
}

int main(int argc, char **argv)
{
	long n_ops = argc > 1 ? atol(argv[1]) : 100000;
	long races = argc > 2 ? atol(argv[2]) : 10000;
	int n = 0;
	DIR *fds = opendir("/proc/self/fd");
	for (struct dirent *e; fds && (e = readdir(fds));)
		if (e->d_name[0] != '.' && atoi(e->d_name) < 1024)
			inherited[atoi(e->d_name)] = 1;
	if (fds)
		closedir(fds);
	/* VERBS_STRESS_SYSLOG=1 (in a mount namespace of its own, where /dev is
	 * a fresh tmpfs: scripts/verbs-abi.sh): this program is the syslog
	 * daemon, to see what ident its own syslog() uses once the device is open. */
	int logfd = -1;
	if (getenv("VERBS_STRESS_SYSLOG")) {
		struct sockaddr_un a = { .sun_family = AF_UNIX, .sun_path = "/dev/log" };
		logfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
		unlink(a.sun_path);
		if (logfd < 0 || bind(logfd, (struct sockaddr *)&a, sizeof(a)) != 0)
			logfd = -1;
		CHECK(logfd >= 0, "a syslog socket at /dev/log");
	}
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		return 1;
	ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	CHECK(ctx != NULL, "ibv_open_device");
	if (!ctx)
		return 1;
	ibv_query_gid(ctx, 1, 0, &gid);
	printf("pid %d\n", (int)getpid()); /* the script looks for files left behind under it */
	if (logfd >= 0) {
		char msg[512] = "";
		syslog(LOG_INFO, "hello from the program");
		struct pollfd lp = { .fd = logfd, .events = POLLIN };
		ssize_t l = poll(&lp, 1, 2000) == 1 ? recv(logfd, msg, sizeof(msg) - 1, 0) : -1;
		if (l > 0)
			msg[l] = 0;
		/* <14>: LOG_USER | LOG_INFO; the ident is the program's name. */
		CHECK(l > 0 && !strncmp(msg, "<14>", 4) && strstr(msg, " verbs_stress: hello") && !strstr(msg, "rsnic"),
		      "the program's syslog() after ibv_open_device: its own ident and facility (\"%s\")", msg);
		close(logfd);
		unlink("/dev/log");
	}

	/* ---- 1. hygiene and return values */
	int threads = count_threads();
	CHECK(threads <= 1 + 2, "threads after ibv_open_device: %d (the program's 1 + at most 2)", threads);
	pd = ibv_alloc_pd(ctx);
	mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
							   IBV_ACCESS_REMOTE_READ)
		: NULL;
	CHECK(pd && mr, "alloc_pd, reg_mr");
	if (!pd || !mr)
		return 1;
	race_ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *ecq = race_ch ? ibv_create_cq(ctx, 8, NULL, race_ch, 0) : NULL;
	{
		char leaks[1024];
		int k = leaky_fds(leaks, sizeof(leaks));
		CHECK(k == 0, "every descriptor above 2 is close-on-exec (%d not:%s)", k, leaks);
	}
	{
		void *hole = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		munmap((char *)hole + 4096, 4096);
		errno = 0;
		struct ibv_mr *m = ibv_reg_mr(pd, hole, 3 * 4096, IBV_ACCESS_LOCAL_WRITE);
		CHECK(m == NULL && errno == EFAULT, "reg_mr over a range with an unmapped page: NULL/EFAULT (errno %d)",
		      errno);
		if (m)
			ibv_dereg_mr(m);
		munmap(hole, 3 * 4096);
	}
	{
		/* A WRITE to an rkey that does not exist: the QP goes to ERR by
		 * itself (remote access error), and ibv_query_qp says so. */
		struct ibv_cq *c = ibv_create_cq(ctx, 8, NULL, NULL, 0);
		struct ibv_qp *q = c ? rc_qp(pd, c, c) : NULL;
		struct ibv_wc wc = { 0 };
		int ok = q && connect_to(q, q->qp_num) == 0;
		struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey };
		struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		wr.wr.rdma.remote_addr = (uintptr_t)buf;
		wr.wr.rdma.rkey = mr->rkey ^ 0x5500;
		ok = ok && ibv_post_send(q, &wr, &bad) == 0 && wait_wc(c, &wc) == 1 && wc.status != IBV_WC_SUCCESS;
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr qia;
		int st = -1;
		if (ok && ibv_query_qp(q, &qa, IBV_QP_STATE, &qia) == 0)
			st = qa.qp_state;
		CHECK(ok && st == IBV_QPS_ERR && q->state == IBV_QPS_ERR,
		      "query_qp after an error completion (%s): IBV_QPS_ERR (state %d, qp->state %d)",
		      ibv_wc_status_str(wc.status), st, q ? (int)q->state : -1);
		if (q)
			ibv_destroy_qp(q);
		if (c)
			ibv_destroy_cq(c);
	}

	/* ---- 2. destroy_cq waits for the acknowledgement of its events */
	{
		struct ibv_qp *q = ecq ? rc_qp(pd, ecq, ecq) : NULL;
		struct ibv_wc wc;
		int ok = q && connect_to(q, q->qp_num) == 0 && ibv_req_notify_cq(ecq, 0) == 0 && write8(q, 0, 64) == 0;
		struct pollfd pf = { .fd = race_ch ? race_ch->fd : -1, .events = POLLIN };
		struct ibv_cq *ev = NULL;
		void *evctx;
		ok = ok && poll(&pf, 1, 5000) == 1 && ibv_get_cq_event(race_ch, &ev, &evctx) == 0 && ev == ecq &&
		     wait_wc(ecq, &wc) == 1;
		ok = ok && ibv_destroy_qp(q) == 0;
		q = NULL;
		/* The acknowledgement comes 300 ms later from another thread. */
		pthread_t t;
		ok = ok && pthread_create(&t, NULL, ack_later, ecq) == 0;
		double t0 = now();
		int rc = ok ? ibv_destroy_cq(ecq) : -1;
		double waited = now() - t0;
		if (ok)
			pthread_join(t, NULL);
		CHECK(ok && rc == 0 && waited > 0.25,
		      "destroy_cq with an unacknowledged event waits for ibv_ack_cq_events: 0 after %.0f ms (rc %d)",
		      waited * 1000, rc);
		ecq = NULL;
	}

	/* ---- 3. the stress */
	ops_target = n_ops;
	shared_a = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	shared_b = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	pthread_barrier_init(&pair_barrier, NULL, 2);
	pthread_t th[8];
	double t0 = now();
	for (int i = 0; i < 4; i++)
		pthread_create(&th[i], NULL, churn, (void *)(intptr_t)i);
	for (int i = 4; i < 6; i++)
		pthread_create(&th[i], NULL, double_destroy, (void *)(intptr_t)i);
	for (int i = 6; i < 8; i++)
		pthread_create(&th[i], NULL, poster, (void *)(intptr_t)i);
	for (int i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	double secs = now() - t0;
	CHECK(stress_fail == 0 && ibv_destroy_cq(shared_a) == 0 && ibv_destroy_cq(shared_b) == 0,
	      "8 threads, %ld verbs in %.1f s: creates, destroys, EBUSY parents, double destroys, posts and polls "
	      "(%d failures)",
	      (long)atomic_load(&ops), secs, (int)stress_fail);

	/* ---- 4. ibv_get_cq_event racing ibv_destroy_cq */
	{
		fcntl(race_ch->fd, F_SETFL, fcntl(race_ch->fd, F_GETFL) | O_NONBLOCK);
		pthread_barrier_init(&race_barrier, NULL, 2);
		pthread_t g;
		pthread_create(&g, NULL, race_getter, NULL);
		int setup_fail = 0, destroy_bad = 0;
		double r0 = now();
		for (long i = 0; i < races && !setup_fail; i++) {
			struct ibv_cq *c = ibv_create_cq(ctx, 8, (void *)0xc0ffee, race_ch, 0);
			struct ibv_qp *q = c ? rc_qp(pd, c, c) : NULL;
			struct ibv_wc wc;
			struct pollfd pf = { .fd = race_ch->fd, .events = POLLIN };
			if (!q || connect_to(q, q->qp_num) || ibv_req_notify_cq(c, 0) || write8(q, 8, 128) ||
			    wait_wc(c, &wc) != 1 || poll(&pf, 1, 5000) != 1 || ibv_destroy_qp(q)) {
				printf("  race %ld: set-up failed (errno %d)\n", i, errno);
				setup_fail = 1;
				break;
			}
			atomic_store(&race_cq, c);
			atomic_store(&race_destroyed, 0);
			pthread_barrier_wait(&race_barrier);
			int rc = ibv_destroy_cq(c);
			atomic_store(&race_destroyed, 1);
			pthread_barrier_wait(&race_barrier);
			if (rc == EBUSY) {
				atomic_fetch_add(&race_busy, 1);
				rc = ibv_destroy_cq(c);
			}
			if (rc != 0)
				destroy_bad++;
		}
		atomic_store(&race_cq, NULL);
		pthread_barrier_wait(&race_barrier);
		pthread_join(g, NULL);
		CHECK(!setup_fail && !destroy_bad && !race_bad && race_got + race_destroy_first == races,
		      "%ld rounds of get_cq_event racing destroy_cq in %.1f s: event first %d, destroy first %d, EBUSY %d, "
		      "bad %d",
		      races, now() - r0, (int)race_got, (int)race_destroy_first, (int)race_busy,
		      (int)race_bad + destroy_bad);
	}

	/* ---- 5. fork after opening the device */
	{
		struct ibv_cq *c = ibv_create_cq(ctx, 16, NULL, NULL, 0);
		struct ibv_qp *q = c ? rc_qp(pd, c, c) : NULL;
		struct ibv_wc wc;
		int ok = q && connect_to(q, q->qp_num) == 0 && write8(q, 0, 256) == 0 && wait_wc(c, &wc) == 1;
		CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED && ibv_fork_init() == 0,
		      "is_fork_initialized: IBV_FORK_UNNEEDED, fork_init: 0");
		fflush(stdout);
		pid_t child = fork();
		if (child == 0) {
			alarm(10); /* a hang kills the child: the parent sees the signal */
			/* VERBS_STRESS_CHILD_EXIT_ONLY=1: the child only exit()s (to
			 * show what its exit handlers do where its verbs would hang). */
			if (getenv("VERBS_STRESS_CHILD_EXIT_ONLY"))
				exit(0);
			errno = 0;
			int bad = 0;
			bad |= ibv_alloc_pd(ctx) != NULL || errno != EIO;
			bad |= ibv_post_send(q, NULL, NULL) != EIO;
			bad |= ibv_poll_cq(c, 1, &wc) >= 0;
			bad |= ibv_destroy_qp(q) != EIO;
			bad |= ibv_destroy_cq(c) != EIO;
			errno = 0;
			bad |= ibv_get_device_list(NULL) != NULL || errno != EIO;
			exit(bad ? 3 : 0); /* exit(), not _exit(): the atexit handlers run */
		}
		int status = -1;
		double f0 = now();
		while (waitpid(child, &status, WNOHANG) == 0 && now() - f0 < 15)
			usleep(10000);
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "the forked child's verbs fail with EIO and it exits (status %#x)", status);
		int after = ok;
		for (int i = 0; after && i < 100; i++)
			after = write8(q, 0, 256 + 8 * (i % 8)) == 0 && wait_wc(c, &wc) == 1 && wc.status == IBV_WC_SUCCESS;
		CHECK(ok && after, "the parent's traffic goes on after the fork (100 WRITEs)");
		/* VERBS_STRESS_AFTER_FORK: a shell command that must succeed now,
		 * the child gone and the parent alive (scripts/afxdp.sh: the XDP
		 * program is still attached to the interface). */
		const char *cmd = getenv("VERBS_STRESS_AFTER_FORK");
		if (cmd) {
			int rc = system(cmd);
			CHECK(rc == 0, "after the child's exit, the parent alive: `%s` succeeds (status %#x)", cmd, rc);
		}
		if (q)
			ibv_destroy_qp(q);
		if (c)
			ibv_destroy_cq(c);
	}

	/* ibv_close_device(3) does not release what is left (perftest's
	 * ib_send_bw closes with objects alive): 0, the context takes no new
	 * object, what is left stays usable and is released by the program,
	 * and the context goes with the last of it (ASan sees no leak or
	 * use-after-free). */
	CHECK(ibv_destroy_comp_channel(race_ch) == 0 && ibv_dereg_mr(mr) == 0, "tear down the channel and the region");
	CHECK(ibv_close_device(ctx) == 0, "close_device with a PD alive: 0");
	errno = 0;
	CHECK(ibv_alloc_pd(ctx) == NULL && errno == EINVAL, "alloc_pd on the closed context: NULL/EINVAL");
	CHECK(ibv_dealloc_pd(pd) == 0, "dealloc_pd after close_device: 0 (the context goes with it)");
	printf("verbs_stress: %s (%d failed)\n", failures ? "FAILED" : "all passed", failures);
	return failures ? 1 : 0;
}
