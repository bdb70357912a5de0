/*
 * librdmacm's API of librsnic_verbs.so seen from C (issue 41 item 3): compiled
 * against the system's rdma/rdma_cma.h, linked with -lrdmacm -libverbs, run
 * preloaded on a looped-back net_ring0 port by scripts/verbs-abi.sh ("abi"
 * part). The port's frames come back to it, so a listener and a connector of
 * this one process reach each other through the wire path: REQ, REP, RTU,
 * DREQ and DREP on QP 1, then a SEND and an RDMA WRITE between the two QPs.
 *
 * Checks: rdma_get_devices; an event channel's descriptor (non-blocking:
 * rdma_get_cm_event fails with EAGAIN when nothing is queued; poll() sees an
 * event); the errno of each bad call (rdma_create_id with an unknown port
 * space, rdma_bind_addr to an address not ours (EADDRNOTAVAIL) or to a port
 * another id listens on (EADDRINUSE), rdma_connect before the route,
 * rdma_set_option with a bad length, rdma_ack_cm_event of a foreign pointer,
 * rdma_accept of an id that has no request); rdma_event_str; rdma_getaddrinfo
 * (RAI_PASSIVE, numeric); the whole asynchronous flow (ADDR_RESOLVED,
 * ROUTE_RESOLVED, CONNECT_REQUEST with the client's private data after
 * rdma_cm's header, ESTABLISHED on both sides with the server's), data through
 * the connected QPs, rdma_disconnect (DISCONNECTED on both sides); a
 * rejected request (REJECTED, status 28, the private data); UD over SIDR
 * (udaddy's flow: CONNECT_REQUEST, ESTABLISHED with the QPN and Q_Key, a
 * datagram); rdma_destroy_id of everything; every thread the library
 * started (the engine's, DPDK's, the CM's) blocks the program's signals, so an
 * alarm meant to interrupt the program's own wait reaches the program's
 * thread (qperf stops its tests so). Exits 0 only if every check
 * passed; prints one line per check.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <signal.h>

#include "check.h"

static struct rdma_event_channel *ch;

/* The next event (waiting up to 5 s in poll on the channel's descriptor). */
static struct rdma_cm_event *next_event(void)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	struct rdma_cm_event *e = NULL;

	for (int i = 0; i < 50; i++) {
		if (rdma_get_cm_event(ch, &e) == 0)
			return e;
		if (errno != EAGAIN)
			return NULL;
		poll(&p, 1, 100);
	}
	return NULL;
}

/* Takes the next event, checks its type (and id), acks it; its status. */
static int expect(enum rdma_cm_event_type t, struct rdma_cm_id **id, const char *what)
{
	struct rdma_cm_event *e = next_event();
	int status;

	CHECK(e && e->event == t, "%s: %s (got %s, status %d)", what, rdma_event_str(t),
	      e ? rdma_event_str(e->event) : "nothing", e ? e->status : 0);
	if (!e)
		return -1;
	if (id)
		*id = e->id;
	status = e->status;
	rdma_ack_cm_event(e);
	return status;
}

static struct sockaddr_in addr_of(const char *ip, int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	inet_pton(AF_INET, ip, &a.sin_addr);
	return a;
}

static struct ibv_qp_init_attr qp_attr(enum ibv_qp_type t)
{
	struct ibv_qp_init_attr a = {
		.qp_type = t,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.sq_sig_all = 1,
	};
	return a;
}

/* Polls a CQ for one completion (5 s). */
static int one_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (long i = 0; i < 5000000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
	}
	return 0;
}

/* Threads of this process not started by the program (rsnic-*, eal-*) that
 * leave one of SIGALRM, SIGINT, SIGTERM, SIGUSR1 unblocked: their count. */
static int library_threads_taking_signals(int *seen)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int bad = 0;

	*seen = 0;
	while (d && (e = readdir(d))) {
		char path[300], comm[64] = "", line[256];
		unsigned long long blk = 0;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
		if ((f = fopen(path, "r"))) {
			if (!fgets(comm, sizeof comm, f))
				comm[0] = 0;
			comm[strcspn(comm, "\n")] = 0;
			fclose(f);
		}
		if (strncmp(comm, "rsnic-", 6) && strncmp(comm, "eal-", 4))
			continue;
		(*seen)++;
		snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
		if ((f = fopen(path, "r"))) {
			while (fgets(line, sizeof line, f))
				if (sscanf(line, "SigBlk: %llx", &blk) == 1)
					break;
			fclose(f);
		}
		int sigs[] = { SIGALRM, SIGINT, SIGTERM, SIGUSR1 };
		for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
			if (!(blk & (1ULL << (sigs[i] - 1)))) {
				printf("     %s leaves signal %d unblocked\n", comm, sigs[i]);
				bad++;
				break;
			}
	}
	if (d)
		closedir(d);
	return bad;
}

int main(int argc, char **argv)
{
	const char *me = argc > 1 ? argv[1] : "10.0.0.9";
	struct rdma_cm_id *listen_id, *client, *server = NULL, *id;
	struct rdma_cm_event *ev;
	struct sockaddr_in a;
	int n = 0, flags;

	struct ibv_context **devs = rdma_get_devices(&n);
	CHECK(devs && n == 1 && devs[0] && devs[1] == NULL, "rdma_get_devices: one device (%d)", n);
	rdma_free_devices(devs);

	ch = rdma_create_event_channel();
	CHECK(ch && ch->fd >= 0, "rdma_create_event_channel: a descriptor (%d)", ch ? ch->fd : -1);
	flags = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK);
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN,
	      "rdma_get_cm_event on an empty non-blocking channel: -1, EAGAIN (%s)", strerror(errno));

	errno = 0;
	CHECK(rdma_create_id(ch, &id, NULL, (enum rdma_port_space)0x4242) == -1 && errno == EINVAL,
	      "rdma_create_id with an unknown port space: EINVAL (%s)", strerror(errno));

	CHECK(rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (listener)");
	a = addr_of("10.200.0.1", 7000);
	errno = 0;
	CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&a) == -1 && errno == EADDRNOTAVAIL,
	      "rdma_bind_addr to an address not ours: EADDRNOTAVAIL (%s)", strerror(errno));
	/* A loopback address binds, to no device, as a wildcard does (Linux 6.1
	 * with rxe: verbs NULL, port_num 0; libfabric's verbs provider then takes
	 * the device's addresses as its source). */
	{
		struct rdma_cm_id *lo = NULL;
		a = addr_of("127.0.0.1", 7000);
		CHECK(rdma_create_id(ch, &lo, NULL, RDMA_PS_TCP) == 0 &&
			      rdma_bind_addr(lo, (struct sockaddr *)&a) == 0 && lo->verbs == NULL &&
			      lo->port_num == 0,
		      "rdma_bind_addr to 127.0.0.1: bound, to no device (verbs NULL, port_num 0)");
		if (lo)
			rdma_destroy_id(lo);
	}
	a = addr_of(me, 7471);
	CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&a) == 0, "rdma_bind_addr %s:7471", me);
	CHECK(rdma_listen(listen_id, 8) == 0, "rdma_listen");
	CHECK(rdma_get_src_port(listen_id) == htons(7471), "rdma_get_src_port: 7471");
	CHECK(listen_id->verbs != NULL, "a bound id has its device (cm_id->verbs)");
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (second)");
	errno = 0;
	CHECK(rdma_bind_addr(id, (struct sockaddr *)&a) == -1 && errno == EADDRINUSE,
	      "rdma_bind_addr to a port another id listens on: EADDRINUSE (%s)", strerror(errno));
	errno = 0;
	CHECK(rdma_connect(id, NULL) == -1 && errno == EINVAL,
	      "rdma_connect without a route: EINVAL (%s)", strerror(errno));
	errno = 0;
	CHECK(rdma_accept(id, NULL) == -1 && errno == EINVAL,
	      "rdma_accept of an id without a request: EINVAL (%s)", strerror(errno));
	uint8_t tos = 32;
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0, "rdma_set_option TOS");
	errno = 0;
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 4) == -1 && errno == EINVAL,
	      "rdma_set_option with a bad length: EINVAL (%s)", strerror(errno));
	struct rdma_cm_event fake;
	errno = 0;
	CHECK(rdma_ack_cm_event(&fake) == -1 && errno == EINVAL,
	      "rdma_ack_cm_event of a foreign pointer: EINVAL (%s)", strerror(errno));
	CHECK(rdma_destroy_id(id) == 0, "rdma_destroy_id (second)");
	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED") == 0 &&
		      strcmp(rdma_event_str((enum rdma_cm_event_type)99), "UNKNOWN EVENT") == 0,
	      "rdma_event_str");

	struct rdma_addrinfo hints = { .ai_flags = RAI_PASSIVE | RAI_NUMERICHOST }, *res = NULL;
	CHECK(rdma_getaddrinfo(me, "7471", &hints, &res) == 0 && res && res->ai_src_addr &&
		      res->ai_port_space == RDMA_PS_TCP && res->ai_qp_type == IBV_QPT_RC &&
		      ((struct sockaddr_in *)res->ai_src_addr)->sin_port == htons(7471),
	      "rdma_getaddrinfo(RAI_PASSIVE): the source address, TCP port space, RC");
	rdma_freeaddrinfo(res);

	/* The asynchronous flow, both sides in this process. */
	CHECK(rdma_create_id(ch, &client, (void *)0xc11e, RDMA_PS_TCP) == 0, "rdma_create_id (client)");
	a = addr_of(me, 7471);
	CHECK(rdma_resolve_addr(client, NULL, (struct sockaddr *)&a, 2000) == 0, "rdma_resolve_addr");
	expect(RDMA_CM_EVENT_ADDR_RESOLVED, NULL, "client");
	CHECK(rdma_resolve_route(client, 2000) == 0, "rdma_resolve_route");
	expect(RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, "client");
	CHECK(client->route.num_paths == 1 && client->route.path_rec, "route: one path record");
	struct ibv_qp_init_attr qa = qp_attr(IBV_QPT_RC);
	CHECK(rdma_create_qp(client, NULL, &qa) == 0 && client->qp && client->send_cq && client->recv_cq,
	      "rdma_create_qp with no PD and no CQs: the id's default PD and CQs made for it");
	struct rdma_conn_param cp = { .private_data = "from the client", .private_data_len = 16,
				      .responder_resources = 4, .initiator_depth = 4, .retry_count = 7,
				      .rnr_retry_count = 7 };
	CHECK(rdma_connect(client, &cp) == 0, "rdma_connect");

	ev = next_event();
	CHECK(ev && ev->event == RDMA_CM_EVENT_CONNECT_REQUEST && ev->listen_id == listen_id,
	      "server: CONNECT_REQUEST on the listener (%s)", ev ? rdma_event_str(ev->event) : "nothing");
	if (!ev)
		return 1;
	server = ev->id;
	CHECK(ev->param.conn.private_data_len == 56 &&
		      memcmp(ev->param.conn.private_data, "from the client", 16) == 0,
	      "the request carries the client's private data after rdma_cm's header (%d bytes)",
	      ev->param.conn.private_data_len);
	CHECK(ev->param.conn.responder_resources == 4 && ev->param.conn.initiator_depth == 4,
	      "the request's resources seen from the server (%d, %d)", ev->param.conn.responder_resources,
	      ev->param.conn.initiator_depth);
	struct sockaddr_in *peer = (struct sockaddr_in *)rdma_get_peer_addr(server);
	CHECK(peer->sin_family == AF_INET && peer->sin_port == rdma_get_src_port(client),
	      "the new id's peer address is the client's");
	CHECK(server->verbs == listen_id->verbs && server->context == NULL, "the new id's device and context");
	rdma_ack_cm_event(ev);
	qa = qp_attr(IBV_QPT_RC);
	CHECK(rdma_create_qp(server, NULL, &qa) == 0, "rdma_create_qp (server)");

	/* A receive on each side before the connection is up. */
	static char sbuf[64], cbuf[64], wbuf[64];
	struct ibv_mr *smr = ibv_reg_mr(server->pd, sbuf, sizeof sbuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_mr *cmr = ibv_reg_mr(client->pd, cbuf, sizeof cbuf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *wmr = ibv_reg_mr(client->pd, wbuf, sizeof wbuf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge sge = { .addr = (uintptr_t)sbuf, .length = 64, .lkey = smr->lkey };
	struct ibv_recv_wr rwr = { .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(ibv_post_recv(server->qp, &rwr, &bad) == 0, "server posts a receive");

	struct rdma_conn_param sp = { .private_data = "from the server", .private_data_len = 16,
				      .responder_resources = 4, .initiator_depth = 4, .rnr_retry_count = 7 };
	CHECK(rdma_accept(server, &sp) == 0, "rdma_accept");
	for (int i = 0; i < 2; i++) {
		ev = next_event();
		CHECK(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED, "ESTABLISHED (%s, %s)",
		      ev ? (ev->id == client ? "client" : "server") : "-", ev ? rdma_event_str(ev->event) : "nothing");
		if (ev && ev->id == client)
			CHECK(ev->param.conn.private_data_len > 0 &&
				      memcmp(ev->param.conn.private_data, "from the server", 16) == 0,
			      "the client's ESTABLISHED carries the server's private data");
		if (ev)
			rdma_ack_cm_event(ev);
	}

	/* A SEND, then a WRITE into the server's buffer. */
	strcpy(cbuf, "hello over rdma_cm");
	struct ibv_sge cs = { .addr = (uintptr_t)cbuf, .length = 19, .lkey = cmr->lkey };
	struct ibv_send_wr swr = { .sg_list = &cs, .num_sge = 1, .opcode = IBV_WR_SEND }, *sbad;
	struct ibv_wc wc;
	CHECK(ibv_post_send(client->qp, &swr, &sbad) == 0, "client posts a SEND");
	CHECK(one_wc(client->send_cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "the SEND completes (%s)",
	      ibv_wc_status_str(wc.status));
	CHECK(one_wc(server->recv_cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 19 &&
		      strcmp(sbuf, "hello over rdma_cm") == 0,
	      "the server receives it (%u bytes)", wc.byte_len);
	strcpy(wbuf, "written");
	struct ibv_sge ws = { .addr = (uintptr_t)wbuf, .length = 8, .lkey = wmr->lkey };
	struct ibv_send_wr wwr = { .sg_list = &ws, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				   .wr.rdma = { .remote_addr = (uintptr_t)sbuf + 32, .rkey = smr->rkey } };
	CHECK(ibv_post_send(client->qp, &wwr, &sbad) == 0 && one_wc(client->send_cq, &wc) == 1 &&
		      wc.status == IBV_WC_SUCCESS && strcmp(sbuf + 32, "written") == 0,
	      "an RDMA WRITE lands (%s)", ibv_wc_status_str(wc.status));

	CHECK(rdma_disconnect(client) == 0, "rdma_disconnect (client)");
	for (int i = 0; i < 2; i++) {
		ev = next_event();
		CHECK(ev && ev->event == RDMA_CM_EVENT_DISCONNECTED, "DISCONNECTED (%s)",
		      ev ? (ev->id == client ? "client" : "server") : "nothing");
		if (ev)
			rdma_ack_cm_event(ev);
	}
	CHECK(rdma_disconnect(server) == 0, "rdma_disconnect (server, after the peer's)");
	ibv_dereg_mr(smr);
	ibv_dereg_mr(cmr);
	ibv_dereg_mr(wmr);
	rdma_destroy_qp(client);
	rdma_destroy_qp(server);
	CHECK(rdma_destroy_id(client) == 0 && rdma_destroy_id(server) == 0, "rdma_destroy_id (both)");

	/* A rejected request. */
	CHECK(rdma_create_id(ch, &client, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (second client)");
	rdma_resolve_addr(client, NULL, (struct sockaddr *)&a, 2000);
	expect(RDMA_CM_EVENT_ADDR_RESOLVED, NULL, "second client");
	rdma_resolve_route(client, 2000);
	expect(RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, "second client");
	cp.qp_num = 0x77;
	CHECK(rdma_connect(client, &cp) == 0, "rdma_connect (no QP on the id: the QPN of conn_param)");
	expect(RDMA_CM_EVENT_CONNECT_REQUEST, &server, "server");
	CHECK(rdma_reject(server, "busy", 5) == 0, "rdma_reject with private data");
	ev = next_event();
	CHECK(ev && ev->event == RDMA_CM_EVENT_REJECTED && ev->status == 28 &&
		      memcmp(ev->param.conn.private_data, "busy", 5) == 0,
	      "client: REJECTED, status 28 (consumer), the private data (%s, %d)",
	      ev ? rdma_event_str(ev->event) : "nothing", ev ? ev->status : 0);
	if (ev)
		rdma_ack_cm_event(ev);
	rdma_destroy_id(server);
	rdma_destroy_id(client);
	CHECK(rdma_destroy_id(listen_id) == 0, "rdma_destroy_id (listener)");

	/* Nobody listens on the port any more: the CM answers the REQ with REJ
	 * "invalid service ID", REJECTED with status 8 (IBA 12.6.7.2), as a
	 * kernel's CM does. */
	CHECK(rdma_create_id(ch, &client, NULL, RDMA_PS_TCP) == 0, "rdma_create_id (third client)");
	rdma_resolve_addr(client, NULL, (struct sockaddr *)&a, 2000);
	expect(RDMA_CM_EVENT_ADDR_RESOLVED, NULL, "third client");
	rdma_resolve_route(client, 2000);
	expect(RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, "third client");
	CHECK(rdma_connect(client, &cp) == 0, "rdma_connect (to a port nobody listens on)");
	CHECK(expect(RDMA_CM_EVENT_REJECTED, NULL, "no listener") == 8, "no listener: status 8 (invalid service ID)");
	CHECK(rdma_destroy_id(client) == 0, "rdma_destroy_id (third client)");

	/* A loopback destination resolves (to this device) but has no route, as
	 * on Linux 6.1 with rxe (`rping -c -a 127.0.0.1`: "rdma_resolve_route: No
	 * such device"). */
	{
		struct sockaddr_in lo = addr_of("127.0.0.1", 7471);
		CHECK(rdma_create_id(ch, &client, NULL, RDMA_PS_TCP) == 0 &&
			      rdma_resolve_addr(client, NULL, (struct sockaddr *)&lo, 2000) == 0,
		      "rdma_resolve_addr 127.0.0.1");
		expect(RDMA_CM_EVENT_ADDR_RESOLVED, NULL, "loopback");
		errno = 0;
		CHECK(rdma_resolve_route(client, 2000) == -1 && errno == ENODEV,
		      "rdma_resolve_route to 127.0.0.1: ENODEV (%s)", strerror(errno));
		rdma_destroy_id(client);
	}

	/* UD over SIDR. */
	struct rdma_cm_id *ul, *uc, *us;
	CHECK(rdma_create_id(ch, &ul, NULL, RDMA_PS_UDP) == 0, "rdma_create_id (UDP listener)");
	a = addr_of(me, 7472);
	CHECK(rdma_bind_addr(ul, (struct sockaddr *)&a) == 0 && rdma_listen(ul, 4) == 0, "UDP bind and listen");
	CHECK(rdma_create_id(ch, &uc, NULL, RDMA_PS_UDP) == 0, "rdma_create_id (UDP client)");
	rdma_resolve_addr(uc, NULL, (struct sockaddr *)&a, 2000);
	expect(RDMA_CM_EVENT_ADDR_RESOLVED, NULL, "UDP client");
	rdma_resolve_route(uc, 2000);
	expect(RDMA_CM_EVENT_ROUTE_RESOLVED, NULL, "UDP client");
	qa = qp_attr(IBV_QPT_UD);
	CHECK(rdma_create_qp(uc, NULL, &qa) == 0, "rdma_create_qp (UD client)");
	CHECK(rdma_connect(uc, NULL) == 0, "rdma_connect (SIDR_REQ)");
	expect(RDMA_CM_EVENT_CONNECT_REQUEST, &us, "UDP server");
	qa = qp_attr(IBV_QPT_UD);
	CHECK(rdma_create_qp(us, NULL, &qa) == 0, "rdma_create_qp (UD server)");
	static char ubuf[64 + 40];
	struct ibv_mr *umr = ibv_reg_mr(us->pd, ubuf, sizeof ubuf, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge us_sge = { .addr = (uintptr_t)ubuf, .length = sizeof ubuf, .lkey = umr->lkey };
	struct ibv_recv_wr urwr = { .sg_list = &us_sge, .num_sge = 1 };
	CHECK(ibv_post_recv(us->qp, &urwr, &bad) == 0, "UD server posts a receive");
	CHECK(rdma_accept(us, NULL) == 0, "rdma_accept (SIDR_REP)");
	ev = next_event();
	CHECK(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED && ev->param.ud.qp_num == us->qp->qp_num &&
		      ev->param.ud.qkey == RDMA_UDP_QKEY,
	      "UD client: ESTABLISHED with the server's QPN and rdma_cm's Q_Key (%s)",
	      ev ? rdma_event_str(ev->event) : "nothing");
	if (ev) {
		struct ibv_ah *ah = ibv_create_ah(uc->pd, &ev->param.ud.ah_attr);
		uint32_t qpn = ev->param.ud.qp_num, qkey = ev->param.ud.qkey;
		rdma_ack_cm_event(ev);
		strcpy(cbuf, "a datagram");
		struct ibv_mr *m = ibv_reg_mr(uc->pd, cbuf, sizeof cbuf, IBV_ACCESS_LOCAL_WRITE);
		struct ibv_sge s1 = { .addr = (uintptr_t)cbuf, .length = 11, .lkey = m->lkey };
		struct ibv_send_wr u = { .sg_list = &s1, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .wr.ud = { .ah = ah, .remote_qpn = qpn, .remote_qkey = qkey } };
		CHECK(ah && ibv_post_send(uc->qp, &u, &sbad) == 0 && one_wc(uc->send_cq, &wc) == 1,
		      "UD client sends a datagram through the address handle");
		CHECK(one_wc(us->recv_cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
			      strcmp(ubuf + 40, "a datagram") == 0,
		      "UD server receives it after the GRH (%s)", ibv_wc_status_str(wc.status));
		ibv_destroy_ah(ah);
		ibv_dereg_mr(m);
	}
	ibv_dereg_mr(umr);
	rdma_destroy_qp(uc);
	rdma_destroy_qp(us);
	CHECK(rdma_destroy_id(us) == 0 && rdma_destroy_id(uc) == 0 && rdma_destroy_id(ul) == 0,
	      "rdma_destroy_id (UD)");
	int seen, untouched = library_threads_taking_signals(&seen);
	CHECK(seen >= 2 && untouched == 0, "the library's %d threads block the program's signals (%d do not)", seen, untouched);
	rdma_destroy_event_channel(ch);
	printf("%s: %d failures\n", failures ? "FAIL" : "ok", failures);
	return failures != 0;
}
