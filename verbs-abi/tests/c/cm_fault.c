/* What librdmacm delivers when a connection set-up or a connection ends
 * badly, across two processes (scripts/verbs-abi.sh cm runs one in each
 * namespace):
 *
 *   cm_fault server-dies IP PORT     listens; on the request it kills itself
 *                                    (SIGKILL: its NIC goes silent with it)
 *   cm_fault client-unreachable IP PORT
 *                                    connects; expects the REQ's retries to
 *                                    end in RDMA_CM_EVENT_UNREACHABLE with
 *                                    status -ETIMEDOUT (ib_cm's REQ_ERROR, as
 *                                    the kernel's rdma_cm reports it)
 *   cm_fault server-disconnects IP PORT
 *                                    accepts, then disconnects first
 *   cm_fault client-disconnected IP PORT
 *                                    connects; expects ESTABLISHED, then
 *                                    DISCONNECTED from the server's DREQ
 *
 * Prints ok/FAIL lines; exits 0 when every check passed. Time bounds come
 * from RSNIC_CM_TIMEOUT / RSNIC_CM_RETRIES (the script makes them short).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static struct rdma_event_channel *ch;

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* The next event, waiting up to `secs` in poll() on the channel's fd. */
static struct rdma_cm_event *next_event(int secs)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *e = NULL;
	double end = now_s() + secs;

	while (now_s() < end) {
		if (rdma_get_cm_event(ch, &e) == 0)
			return e;
		if (errno != EAGAIN)
			return NULL;
		poll(&p, 1, 100);
	}
	return NULL;
}

/* Takes the next event, checks its type, acks it; its status (or -9999). */
static int expect(enum rdma_cm_event_type t, struct rdma_cm_id **id, int secs, const char *what)
{
	struct rdma_cm_event *e = next_event(secs);
	int status = -9999;

	CHECK(e && e->event == t, "%s: %s (got %s, status %d)", what, rdma_event_str(t),
	      e ? rdma_event_str(e->event) : "nothing", e ? e->status : 0);
	if (!e)
		return status;
	if (id)
		*id = e->id;
	status = e->status;
	rdma_ack_cm_event(e);
	return status;
}

static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr a = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_all = 1,
	};
	return a;
}

/* A connected-to-be client id: address and route resolved, a QP made. */
static struct rdma_cm_id *client(struct sockaddr_in *a)
{
	struct rdma_cm_id *id = NULL;
	struct ibv_qp_init_attr qa = qp_attr();

	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id");
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)a, 2000) == 0, "rdma_resolve_addr");
	expect(RDMA_CM_EVENT_ADDR_RESOLVED, NULL, 5, "client");
	CHECK(rdma_resolve_route(id, 2000) == 0, "rdma_resolve_route");
	expect(RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, 5, "client");
	CHECK(rdma_create_qp(id, NULL, &qa) == 0, "rdma_create_qp");
	return id;
}

/* A listener; the id of the first request (its event acked). */
static struct rdma_cm_id *first_request(struct sockaddr_in *a, struct rdma_cm_id **listener)
{
	struct rdma_cm_id *req = NULL;

	CHECK(rdma_create_id(ch, listener, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (listener)");
	CHECK(rdma_bind_addr(*listener, (struct sockaddr *)a) == 0 && rdma_listen(*listener, 4) == 0,
	      "bind and listen");
	printf("listening\n");
	fflush(stdout);
	expect(RDMA_CM_EVENT_CONNECT_REQUEST, &req, 30, "server");
	return req;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s server-dies|client-unreachable|server-disconnects|client-disconnected IP PORT\n",
			argv[0]);
		return 2;
	}
	const char *mode = argv[1];
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[3])) };
	inet_pton(AF_INET, argv[2], &a.sin_addr);
	struct rdma_cm_id *id = NULL, *listener = NULL;
	struct rdma_conn_param cp = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
				      .rnr_retry_count = 7 };

	ch = rdma_create_event_channel();
	CHECK(ch != NULL, "rdma_create_event_channel");
	if (!ch)
		return 1;

	if (strcmp(mode, "server-dies") == 0) {
		id = first_request(&a, &listener);
		if (id) {
			printf("dying with the request unanswered\n");
			fflush(stdout);
			raise(SIGKILL);
		}
	} else if (strcmp(mode, "client-unreachable") == 0) {
		id = client(&a);
		double t0 = now_s();
		CHECK(rdma_connect(id, &cp) == 0, "rdma_connect");
		int status = expect(RDMA_CM_EVENT_UNREACHABLE, NULL, 120, "the peer died mid-connect");
		double took = now_s() - t0;
		CHECK(status == -ETIMEDOUT, "UNREACHABLE's status: -ETIMEDOUT (%d)", status);
		/* The REQ and every retry each waited the response timeout. */
		const char *t = getenv("RSNIC_CM_TIMEOUT"), *r = getenv("RSNIC_CM_RETRIES");
		double each = 4.096e-6 * (double)(1L << (t ? atoi(t) : 20)), least = (1 + (r ? atoi(r) : 15)) * each;
		CHECK(took >= 0.95 * least && took <= least + 10, "UNREACHABLE after %.2f s: the REQ and its retries, %.2f s",
		      took, least);
		rdma_destroy_qp(id);
		CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
	} else if (strcmp(mode, "server-disconnects") == 0) {
		struct ibv_qp_init_attr qa = qp_attr();
		id = first_request(&a, &listener);
		CHECK(id && rdma_create_qp(id, NULL, &qa) == 0, "rdma_create_qp (server)");
		CHECK(id && rdma_accept(id, &cp) == 0, "rdma_accept");
		expect(RDMA_CM_EVENT_ESTABLISHED, NULL, 10, "server");
		CHECK(rdma_disconnect(id) == 0, "rdma_disconnect (server first)");
		expect(RDMA_CM_EVENT_DISCONNECTED, NULL, 10, "server (the DREP)");
		rdma_destroy_qp(id);
		CHECK(rdma_destroy_id(id) == 0 && rdma_destroy_id(listener) == 0, "rdma_destroy_id (both)");
	} else if (strcmp(mode, "client-disconnected") == 0) {
		id = client(&a);
		CHECK(rdma_connect(id, &cp) == 0, "rdma_connect");
		expect(RDMA_CM_EVENT_ESTABLISHED, NULL, 10, "client");
		expect(RDMA_CM_EVENT_DISCONNECTED, NULL, 10, "client (the server's DREQ)");
		CHECK(rdma_disconnect(id) == 0, "rdma_disconnect (client, after the peer's)");
		/* librdmacm's rdma_disconnect moves the QP to error (ucma_modify_qp_err). */
		struct ibv_qp_attr qattr = { 0 };
		struct ibv_qp_init_attr qinit;
		CHECK(ibv_query_qp(id->qp, &qattr, IBV_QP_STATE, &qinit) == 0 && qattr.qp_state == IBV_QPS_ERR,
		      "the client's QP is in error after rdma_disconnect (state %d)", qattr.qp_state);
		rdma_destroy_qp(id);
		CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id");
	} else {
		fprintf(stderr, "unknown mode %s\n", mode);
		return 2;
	}
	rdma_destroy_event_channel(ch);
	printf("%s: %d failed\n", mode, failures);
	return failures != 0;
}
