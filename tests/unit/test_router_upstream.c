/* The router's HTTP client on a real socket: a whole response reaches on_done with its status,
 * body and content type; and freeing the client while a call still waits on its socket releases
 * the socket poll, the timer and the client in whatever order libuv closes them (under ASan a
 * use after free here fails the test), leaving the loop with no handle open. The peer is a plain
 * listening socket the test drives itself, so nothing depends on timing. */
#include "pd_test.h"

#include "router/upstream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

struct peer {
    int listen_fd;
    int conn_fd;
    char url[64];
};

static int peer_open(struct peer *p) {
    p->conn_fd = -1;
    p->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    if (p->listen_fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    if (bind(p->listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(p->listen_fd, 4) != 0 ||
        getsockname(p->listen_fd, (struct sockaddr *)&a, &len) != 0)
        return -1;
    fcntl(p->listen_fd, F_SETFL, O_NONBLOCK);
    snprintf(p->url, sizeof(p->url), "http://127.0.0.1:%d/v1/models", ntohs(a.sin_port));
    return 0;
}

static void peer_close(struct peer *p) {
    if (p->conn_fd >= 0)
        close(p->conn_fd);
    close(p->listen_fd);
}

/* Turns the loop until the client's whole request head has reached the peer: by then curl has
 * sent it and waits on its socket for the answer. */
static bool peer_wait_request(struct peer *p, uv_loop_t *loop) {
    char buf[4096];
    for (int i = 0; i < 10000; i++) {
        if (p->conn_fd < 0) {
            p->conn_fd = accept(p->listen_fd, NULL, NULL);
            if (p->conn_fd >= 0)
                fcntl(p->conn_fd, F_SETFL, O_NONBLOCK);
        }
        if (p->conn_fd >= 0) {
            ssize_t n = recv(p->conn_fd, buf, sizeof(buf) - 1, MSG_PEEK);
            if (n > 0) {
                buf[n] = '\0';
                if (strstr(buf, "\r\n\r\n"))
                    return true;
            }
        }
        uv_run(loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    return false;
}

struct seen {
    int done;
    int status;
    long http_status;
    char body[64];
    size_t body_len;
    char content_type[64];
};

static void on_data(void *ud, struct pd_upstream_call *call, const char *buf, size_t len) {
    struct seen *s = ud;
    snprintf(s->content_type, sizeof(s->content_type), "%s", pd_upstream_call_content_type(call));
    if (s->body_len + len < sizeof(s->body)) {
        memcpy(s->body + s->body_len, buf, len);
        s->body_len += len;
    }
}

static void on_done(void *ud, struct pd_upstream_call *call, const struct pd_upstream_result *r) {
    struct seen *s = ud;
    s->done++;
    s->status = r->status;
    s->http_status = r->http_status;
    (void)call;
}

static const struct pd_upstream_cbs cbs = {on_data, on_done};

static void test_whole_response(void) {
    uv_loop_t loop;
    CHECK_INT(uv_loop_init(&loop), 0);
    struct peer p;
    CHECK_INT(peer_open(&p), 0);
    struct pd_upstream *up = NULL;
    CHECK_OK(pd_upstream_new(&loop, NULL, &up));
    struct seen s = {0};
    struct pd_upstream_req req = {.method = "GET", .url = p.url, .timeout_ms = 20000};
    struct pd_upstream_call *call = NULL;
    CHECK_OK(pd_upstream_call_start(up, &req, &cbs, &s, &call));
    CHECK_INT(pd_upstream_active(up), 1);
    CHECK(peer_wait_request(&p, &loop));
    char head[4096];
    ssize_t n = recv(p.conn_fd, head, sizeof(head) - 1, 0);
    CHECK(n > 0);
    head[n > 0 ? n : 0] = '\0';
    CHECK(strncmp(head, "GET /v1/models HTTP/1.1\r\n", 25) == 0);
    static const char answer[] = "HTTP/1.1 503 Service Unavailable\r\n"
                                 "Content-Type: application/json\r\n"
                                 "Content-Length: 13\r\n\r\n"
                                 "{\"error\":\"x\"}";
    CHECK_INT(send(p.conn_fd, answer, sizeof(answer) - 1, 0), (long)sizeof(answer) - 1);
    for (int i = 0; i < 10000 && !s.done; i++)
        uv_run(&loop, UV_RUN_ONCE);
    CHECK_INT(s.done, 1);
    CHECK_INT(s.status, PD_OK);
    CHECK_INT(s.http_status, 503);
    CHECK_INT(s.body_len, 13);
    CHECK(memcmp(s.body, "{\"error\":\"x\"}", 13) == 0);
    CHECK_STR(s.content_type, "application/json");
    CHECK_INT(pd_upstream_active(up), 0);
    pd_upstream_free(up);
    CHECK_INT(uv_run(&loop, UV_RUN_DEFAULT), 0);
    CHECK_INT(uv_loop_close(&loop), 0);
    peer_close(&p);
}

/* The router's shutdown: calls still waiting on their sockets when the client is freed. */
static void test_free_while_waiting(void) {
    uv_loop_t loop;
    CHECK_INT(uv_loop_init(&loop), 0);
    struct peer p[2];
    CHECK_INT(peer_open(&p[0]), 0);
    CHECK_INT(peer_open(&p[1]), 0);
    struct pd_upstream *up = NULL;
    CHECK_OK(pd_upstream_new(&loop, NULL, &up));
    struct seen s[2] = {{0}};
    for (int i = 0; i < 2; i++) {
        struct pd_upstream_req req = {
            .method = "POST", .url = p[i].url, .body = "{}", .body_len = 2, .timeout_ms = 20000};
        struct pd_upstream_call *call = NULL;
        CHECK_OK(pd_upstream_call_start(up, &req, &cbs, &s[i], &call));
    }
    CHECK(peer_wait_request(&p[0], &loop));
    CHECK(peer_wait_request(&p[1], &loop));
    CHECK_INT(pd_upstream_active(up), 2);
    pd_upstream_free(up); /* cancels both: no callback runs */
    CHECK_INT(uv_run(&loop, UV_RUN_DEFAULT), 0);
    CHECK_INT(uv_loop_close(&loop), 0);
    CHECK_INT(s[0].done + s[1].done, 0);
    /* the client closed its connections: the peer reads end of stream after the request */
    for (int i = 0; i < 2; i++) {
        char buf[4096];
        ssize_t n;
        while ((n = recv(p[i].conn_fd, buf, sizeof(buf), 0)) > 0)
            ;
        CHECK_INT(n, 0);
        peer_close(&p[i]);
    }
}

PD_TEST_MAIN(PD_TEST(test_whole_response), PD_TEST(test_free_while_waiting))
