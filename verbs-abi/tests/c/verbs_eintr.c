/*
 * A quiet guest (issue 40, item 8): a program whose thread sleeps in
 * poll(2) on its completion channel must never see EINTR because of rsnic.
 * DPDK 22.11's net_tap signals the process (a real-time signal, F_SETOWN
 * getpid) for every frame its TAP queues; the kernel hands a process's
 * signal to the main thread first, and poll(2) is never restarted after a
 * handler (signal(7)), so before the fix every frame cost the program an
 * EINTR.
 *
 * Two processes, one per network namespace, each on its own TAP port
 * (scripts/verbs-abi.sh, "eintr"): the client sends ITERS SENDs of SIZE
 * bytes, the server receives them; both sleep on their completion channel
 * (poll, then ibv_get_cq_event, ibv_ack_cq_events, ibv_req_notify_cq,
 * ibv_poll_cq) and count the polls that returned -1/EINTR. QP numbers,
 * PSNs and GIDs go over TCP (port 18600), as ibv_rc_pingpong does.
 *
 * usage: verbs_eintr [-n ITERS] [-s SIZE] [SERVER]   (without SERVER: the server)
 * Prints "eintr: N ..." and exits 0 only if N is 0 and every message arrived.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PORT 18600
#define DEPTH 128 /* receives posted / sends in flight */

struct dest {
	uint32_t qpn, psn;
	union ibv_gid gid;
};

static long eintrs, polls;

static int die(const char *what)
{
	fprintf(stderr, "verbs_eintr: %s: %s\n", what, strerror(errno));
	exit(2);
}

/* The TCP connection to the peer (server: accept one; client: connect). */
static int tcp(const char *server)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(PORT) };
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	if (s < 0)
		die("socket");
	if (!server) {
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 1))
			die("listen");
		int c = accept(s, NULL, NULL);
		close(s);
		return c < 0 ? die("accept") : c;
	}
	inet_pton(AF_INET, server, &a.sin_addr);
	for (int i = 0; i < 100; i++) {
		if (connect(s, (struct sockaddr *)&a, sizeof(a)) == 0)
			return s;
		usleep(100000);
	}
	return die("connect");
}

static void xfer(int s, void *mine, void *theirs, size_t n)
{
	if (write(s, mine, n) != (ssize_t)n)
		die("write");
	for (size_t got = 0; got < n;) {
		ssize_t r = read(s, (char *)theirs + got, n - got);
		if (r <= 0)
			die("read");
		got += r;
	}
}

/* Sleeps on the channel until the CQ has a completion; counts EINTRs. */
static void wait_event(struct ibv_comp_channel *ch, struct ibv_cq *cq)
{
	struct pollfd pf = { .fd = ch->fd, .events = POLLIN };
	for (;;) {
		polls++;
		int r = poll(&pf, 1, 10000);
		if (r == 1)
			break;
		if (r < 0 && errno == EINTR) {
			eintrs++;
			continue;
		}
		if (r == 0) {
			fprintf(stderr, "verbs_eintr: no completion in 10 s\n");
			exit(2);
		}
		die("poll");
	}
	struct ibv_cq *ev;
	void *ctx;
	if (ibv_get_cq_event(ch, &ev, &ctx) || ev != cq)
		die("ibv_get_cq_event");
	ibv_ack_cq_events(cq, 1);
	if (ibv_req_notify_cq(cq, 0))
		die("ibv_req_notify_cq");
}

int main(int argc, char **argv)
{
	long iters = 50000;
	size_t size = 4096;
	int o;
	while ((o = getopt(argc, argv, "n:s:")) != -1) {
		if (o == 'n')
			iters = atol(optarg);
		else if (o == 's')
			size = atol(optarg);
		else
			return 2;
	}
	const char *server = optind < argc ? argv[optind] : NULL;
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		die("no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		die("ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	char *buf = calloc(DEPTH, size);
	struct ibv_mr *mr = pd && buf ? ibv_reg_mr(pd, buf, DEPTH * size, IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 2 * DEPTH, NULL, ch, 0) : NULL;
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = DEPTH, .max_recv_wr = DEPTH, .max_send_sge = 1,
						.max_recv_sge = 1 } };
	struct ibv_qp *qp = mr && cq ? ibv_create_qp(pd, &ia) : NULL;
	if (!qp)
		die("resources");
	struct dest me = { .qpn = qp->qp_num, .psn = server ? 100 : 200 }, peer;
	if (ibv_query_gid(ctx, 1, 0, &me.gid))
		die("ibv_query_gid");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("INIT");
	if (!server)
		for (int i = 0; i < DEPTH; i++) {
			struct ibv_sge sg = { .addr = (uintptr_t)buf + i * size, .length = size, .lkey = mr->lkey };
			struct ibv_recv_wr r = { .wr_id = i, .sg_list = &sg, .num_sge = 1 }, *bad;
			if (ibv_post_recv(qp, &r, &bad))
				die("post_recv");
		}
	int s = tcp(server);
	xfer(s, &me, &peer, sizeof(me));
	struct ibv_qp_attr r = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = peer.qpn,
				 .rq_psn = peer.psn, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
				 .ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = peer.gid, .hop_limit = 64 } } };
	if (ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	struct ibv_qp_attr t = { .qp_state = IBV_QPS_RTS, .sq_psn = me.psn, .timeout = 14, .retry_cnt = 7,
				 .rnr_retry = 7, .max_rd_atomic = 1 };
	if (ibv_modify_qp(qp, &t, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
	/* Both ends are ready (the server has its receives posted). */
	char go = 'g', peer_go;
	xfer(s, &go, &peer_go, 1);
	if (ibv_req_notify_cq(cq, 0))
		die("ibv_req_notify_cq");

	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	long posted = 0, done = 0;
	struct ibv_wc wc[32];
	/* The client sends (server = its peer's address given); the other end
	 * receives and posts each receive again. */
	int sender = server != NULL;
	while (done < iters) {
		while (sender && posted < iters && posted - done < DEPTH) {
			struct ibv_sge sg = { .addr = (uintptr_t)buf + (posted % DEPTH) * size, .length = size,
					      .lkey = mr->lkey };
			struct ibv_send_wr w = { .wr_id = posted, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
						 .send_flags = IBV_SEND_SIGNALED }, *bad;
			if (ibv_post_send(qp, &w, &bad))
				die("post_send");
			posted++;
		}
		int got = ibv_poll_cq(cq, 32, wc);
		if (got < 0)
			die("ibv_poll_cq");
		for (int i = 0; i < got; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "verbs_eintr: completion %s\n", ibv_wc_status_str(wc[i].status));
				return 2;
			}
			done++;
			if (!sender) {
				struct ibv_sge sg = { .addr = (uintptr_t)buf + wc[i].wr_id * size, .length = size,
						      .lkey = mr->lkey };
				struct ibv_recv_wr rw = { .wr_id = wc[i].wr_id, .sg_list = &sg, .num_sge = 1 }, *bad;
				if (ibv_post_recv(qp, &rw, &bad))
					die("post_recv");
			}
		}
		if (got == 0)
			wait_event(ch, cq);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	/* Neither end leaves before the other is done. */
	xfer(s, &go, &peer_go, 1);
	printf("eintr: %ld in %ld polls of the completion channel; %ld %s of %zu B in %.2f s (%.0f MB/s)\n", eintrs,
	       polls, done, sender ? "SENDs" : "receives", size, secs, done * (double)size / secs / 1e6);
	close(s);
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
	ibv_destroy_comp_channel(ch);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return eintrs == 0 ? 0 : 1;
}
