/* Where --nproc ranks run: this machine, a --hosts list, a --hostfile, or the
 * Slurm allocation dtrain runs inside (mpirun then reads the allocation
 * itself: Debian's Open MPI has Slurm support). Checked before anything is
 * launched, with messages that name the host or line at fault. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include "cli.h"

static int add_host(dt_cli_hosts *h, const char *name, size_t len, long slots, const char *where, char *err,
                    int errlen) {
    if (len == 0 || len > 255) {
        snprintf(err, (size_t)errlen, "%s: a host name of %zu characters (1..255)%s", where, len,
                 len ? "" : ": an empty entry (a leading, trailing or doubled comma?)");
        return -1;
    }
    for (size_t i = 0; i < len; i++)
        if (!isalnum((unsigned char)name[i]) && name[i] != '.' && name[i] != '-' && name[i] != '_') {
            snprintf(err, (size_t)errlen, "%s: host '%.*s' has a '%c' (letters, digits, '.', '-', '_')", where,
                     (int)len, name, name[i]);
            return -1;
        }
    if (slots < 1 || slots > 4096) {
        snprintf(err, (size_t)errlen, "%s: host '%.*s' with %ld slots (1..4096)", where, (int)len, name, slots);
        return -1;
    }
    for (int i = 0; i < h->n; i++)
        if (strlen(h->name[i]) == len && !strncasecmp(h->name[i], name, len)) {   /* (names ignore case) */
            snprintf(err, (size_t)errlen, "%s: host '%.*s' listed twice", where, (int)len, name);
            return -1;
        }
    if (h->n == DT_CLI_MAX_HOSTS) {
        snprintf(err, (size_t)errlen, "%s: more than %d hosts", where, DT_CLI_MAX_HOSTS);
        return -1;
    }
    char (*nn)[256] = realloc(h->name, (size_t)(h->n + 1) * sizeof *nn);
    if (nn) h->name = nn;
    int *ns = nn ? realloc(h->slots, (size_t)(h->n + 1) * sizeof *ns) : NULL;
    if (ns) h->slots = ns;
    if (!nn || !ns) {
        snprintf(err, (size_t)errlen, "%s: out of memory", where);
        return -1;
    }
    memcpy(h->name[h->n], name, len);
    h->name[h->n][len] = 0;
    h->slots[h->n++] = (int)slots;
    h->total += (int)slots;
    return 0;
}

/* "h0:2,h1:2" (":N" optional: 1 slot) */
static int parse_list(const char *s, dt_cli_hosts *h, char *err, int errlen) {
    const char *p = s;
    for (;;) {
        size_t len = strcspn(p, ":,");
        long slots = 1;
        const char *q = p + len;
        if (*q == ':') {
            char *end;
            errno = 0;
            slots = isdigit((unsigned char)q[1]) ? strtol(q + 1, &end, 10) : (end = (char *)q + 1, 0);
            if (end == q + 1 || errno || (*end && *end != ',')) {   /* (digits only: not " 2", "+2") */
                snprintf(err, (size_t)errlen, "--hosts %s: after '%.*s:' a slot count (e.g. h0:2,h1:2)", s, (int)len, p);
                return -1;
            }
            q = end;
        }
        if (add_host(h, p, len, slots, "--hosts", err, errlen)) return -1;
        if (!*q) return 0;
        p = q + 1;
    }
}

/* Open MPI's format: "host [slots=N]" per line, '#' comments. */
static int parse_file(const char *path, dt_cli_hosts *h, char *err, int errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, (size_t)errlen, "--hostfile %s: %s", path, strerror(errno));
        return -1;
    }
    char line[1024], where[600];
    int ln = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        ln++;
        snprintf(where, sizeof where, "--hostfile %.500s line %d", path, ln);
        size_t got = strlen(line);
        if (got == sizeof line - 1 && line[got - 1] != '\n' && !feof(f)) {   /* its rest would read as lines */
            snprintf(err, (size_t)errlen, "%s is longer than %d characters", where, (int)sizeof line - 2);
            rc = -1;
            break;
        }
        line[strcspn(line, "#\n")] = 0;
        if (strchr(line, '\r')) {   /* mpirun reads the file itself: no guessing what it makes of a CR */
            snprintf(err, (size_t)errlen, "%s ends in a carriage return (a DOS/Windows text file): convert it, "
                     "e.g. sed -i 's/\\r$//' %.300s", where, path);
            rc = -1;
            break;
        }
        char *p = line;
        while (isspace((unsigned char)*p)) p++;
        if (!*p) continue;
        size_t len = strcspn(p, " \t");
        char *rest = p + len;
        long slots = 1, max_slots = -1;
        int got_slots = 0;
        /* "slots=N" and Open MPI's "max_slots=M" (how far mpirun may
         * oversubscribe it; dtrain places N), in any order */
        while (!rc) {
            while (isspace((unsigned char)*rest)) rest++;
            if (!*rest) break;
            int is_max = !strncmp(rest, "max_slots=", 10);
            char *num = rest + (is_max ? 10 : 6), *end;
            errno = 0;
            long v = is_max || !strncmp(rest, "slots=", 6) ? strtol(num, &end, 10) : -1;
            if (v < 0 || end == num || errno || (*end && !isspace((unsigned char)*end))) {
                snprintf(err, (size_t)errlen, "%s: '%s' (expected \"host slots=N\", optionally \"max_slots=M\")", where, rest);
                rc = -1;
                break;
            }
            if (is_max) max_slots = v;
            else slots = v, got_slots = 1;
            rest = end;
        }
        if (rc) break;
        if (max_slots == 0) {
            snprintf(err, (size_t)errlen, "%s: max_slots=0 (at least 1)", where);
            rc = -1;
            break;
        }
        if (max_slots > 0 && !got_slots) slots = max_slots;   /* as Open MPI reads "host max_slots=M" */
        if (max_slots > 0 && max_slots < slots) {
            snprintf(err, (size_t)errlen, "%s: max_slots=%ld is below slots=%ld", where, max_slots, slots);
            rc = -1;
            break;
        }
        rc = add_host(h, p, len, slots, where, err, errlen);
    }
    fclose(f);
    if (!rc && h->n == 0) {
        snprintf(err, (size_t)errlen, "--hostfile %s: no hosts in it", path);
        rc = -1;
    }
    return rc;
}

/* a task count: digits only, 1 .. INT_MAX (-1 otherwise) */
static long slurm_count(const char *s) {
    if (!s || !isdigit((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno || *end || v < 1 || v > INT_MAX ? -1 : v;
}

/* SLURM_TASKS_PER_NODE: "2(x3),1" = 2 + 2 + 2 + 1; -1 for anything else or
 * a sum past INT_MAX */
static long slurm_tasks(const char *s) {
    long total = 0;
    while (s && *s) {
        char *end;
        errno = 0;
        long n = isdigit((unsigned char)*s) ? strtol(s, &end, 10) : -1, rep = 1;
        if (n < 0 || errno || n > INT_MAX) return -1;
        if (!strncmp(end, "(x", 2)) {
            const char *r = end + 2;
            rep = isdigit((unsigned char)*r) ? strtol(r, &end, 10) : -1;
            if (*end != ')' || rep < 1 || errno || rep > INT_MAX) return -1;
            end++;
        }
        if (n && rep > (INT_MAX - total) / n) return -1;
        total += n * rep;
        if (*end == ',') end++;
        else if (*end) return -1;
        s = end;
    }
    return total;
}

void dt_cli_hosts_free(dt_cli_hosts *h) {
    free(h->name);
    free(h->slots);
    h->name = NULL;
    h->slots = NULL;
    h->n = 0;
}

/* the most tasks on one node: "2(x3),1" -> 2 */
static int slurm_max(const char *s) {
    long best = 0;
    while (s && *s) {
        char *end;
        long n = strtol(s, &end, 10);
        if (end == s) break;
        if (n > best && n <= INT_MAX) best = n;
        end += strcspn(end, ",");
        s = *end ? end + 1 : end;
    }
    return best > 0 ? (int)best : 1;
}

int dt_cli_hosts_parse(const char *hosts, const char *hostfile, dt_cli_hosts *h, char *err, int errlen) {
    memset(h, 0, sizeof *h);
    if (hosts && hostfile) {
        snprintf(err, (size_t)errlen, "--hosts and --hostfile: give one of them");
        return -1;
    }
    if (hosts) {
        if (parse_list(hosts, h, err, errlen)) return -1;
    } else if (hostfile) {
        if (parse_file(hostfile, h, err, errlen)) return -1;
        h->hostfile = hostfile;
    } else if (getenv("SLURM_JOB_ID") && getenv("SLURM_JOB_NODELIST")) {
        const char *tpn = getenv("SLURM_TASKS_PER_NODE"), *nt = getenv("SLURM_NTASKS");
        long total = nt ? slurm_count(nt) : slurm_tasks(tpn);
        const char *nn = getenv("SLURM_JOB_NUM_NODES");
        if (total < 1) {
            snprintf(err, (size_t)errlen, "inside Slurm job %s: cannot read its task count (SLURM_NTASKS=%s, "
                     "SLURM_TASKS_PER_NODE=%s)", getenv("SLURM_JOB_ID"), nt ? nt : "unset", tpn ? tpn : "unset");
            return -1;
        }
        h->slurm = 1;
        h->total = (int)total;
        h->slurm_per_node = slurm_max(tpn);
        if (nn) snprintf(h->desc, sizeof h->desc, "Slurm job %.40s: %.60s (%.12s node%s, %ld tasks)", getenv("SLURM_JOB_ID"),
                         getenv("SLURM_JOB_NODELIST"), nn, !strcmp(nn, "1") ? "" : "s", total);
        else snprintf(h->desc, sizeof h->desc, "Slurm job %.40s: %.60s (%ld tasks)", getenv("SLURM_JOB_ID"),
                      getenv("SLURM_JOB_NODELIST"), total);
        return 0;
    } else {
        return 0;   /* this machine */
    }
    char list[sizeof h->desc - 24];
    dt_cli_hosts_list(h, ", ", list, sizeof list);
    snprintf(h->desc, sizeof h->desc, "%d host%s (%s)", h->n, h->n == 1 ? "" : "s", list);
    return 0;
}

void dt_cli_hosts_list(const dt_cli_hosts *h, const char *sep, char *out, size_t n) {
    char last[300];
    size_t o = 0;
    out[0] = 0;
    if (n < 8) return;
    snprintf(last, sizeof last, "%s...%s%s:%d", sep, sep, h->n ? h->name[h->n - 1] : "", h->n ? h->slots[h->n - 1] : 0);
    for (int i = 0; i < h->n; i++) {
        char e[300];
        int len = snprintf(e, sizeof e, "%s%s:%d", i ? sep : "", h->name[i], h->slots[i]);
        /* room for this one and, unless it is the last, the tail ", ..., last:N" */
        size_t need = (size_t)len + (i + 1 < h->n ? strlen(last) : 0);
        if (o + need >= n) {
            const char *tail = o ? last : last + strlen(sep);   /* (nothing before it: no separator) */
            if (o + strlen(tail) < n) snprintf(out + o, n - o, "%s", tail);
            else snprintf(out + o, n - o, "%s...", i ? sep : "");
            return;
        }
        memcpy(out + o, e, (size_t)len + 1);
        o += (size_t)len;
    }
}

/* Up to ADDRS of a name's addresses (IPv4 or IPv6, as 16 bytes: a v4 one
 * zero-padded), to find two entries that are one machine. */
enum { ADDRS = 8 };
typedef struct host_addrs { unsigned char a[ADDRS][16]; int n; } host_addrs;

static void keep_addrs(const struct addrinfo *ai, host_addrs *h) {
    h->n = 0;
    for (; ai && h->n < ADDRS; ai = ai->ai_next) {
        unsigned char b[16] = {0};
        if (ai->ai_family == AF_INET) memcpy(b, &((const struct sockaddr_in *)(const void *)ai->ai_addr)->sin_addr, 4);
        else if (ai->ai_family == AF_INET6)
            memcpy(b, &((const struct sockaddr_in6 *)(const void *)ai->ai_addr)->sin6_addr, 16);
        else continue;
        int seen = 0;
        for (int k = 0; k < h->n && !seen; k++) seen = !memcmp(h->a[k], b, 16);
        if (!seen) memcpy(h->a[h->n++], b, 16);
    }
}

static int share_addr(const host_addrs *x, const host_addrs *y) {
    for (int i = 0; i < x->n; i++)
        for (int j = 0; j < y->n; j++)
            if (!memcmp(x->a[i], y->a[j], 16)) return 1;
    return 0;
}

/* Host names must resolve, unless the user launches through an agent of
 * their own (OMPI_MCA_plm_rsh_agent: e.g. containers, namespaces), which
 * gives names its own meaning. Two entries for one machine ("localhost" and
 * "127.0.0.1", "node1" and an alias with its address) are refused: mpirun
 * would count it as two machines, two sets of slots on one. */
int dt_cli_hosts_resolve(const dt_cli_hosts *h, char *err, int errlen) {
    const char *agent = getenv("OMPI_MCA_plm_rsh_agent");
    if (agent && *agent) return 0;
    const char *from = h->hostfile ? "--hostfile" : "--hosts";
    host_addrs *ad = calloc((size_t)(h->n > 0 ? h->n : 1), sizeof *ad);
    if (!ad) {
        snprintf(err, (size_t)errlen, "%s: out of memory", from);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < h->n && !rc; i++) {
        struct addrinfo *ai = NULL, hint = {.ai_socktype = SOCK_STREAM};
        int g = getaddrinfo(h->name[i], NULL, &hint, &ai);
        if (g) {
            snprintf(err, (size_t)errlen, "host '%s' (%s): cannot resolve its name: %s", h->name[i], from,
                     gai_strerror(g));
            rc = -1;
            break;
        }
        keep_addrs(ai, &ad[i]);
        freeaddrinfo(ai);
        int here = dt_cli_host_is_here(h->name[i]);
        for (int j = 0; j < i && !rc; j++)
            if ((here && dt_cli_host_is_here(h->name[j])) || share_addr(&ad[i], &ad[j])) {
                snprintf(err, (size_t)errlen, "%s: hosts '%s' and '%s' are one machine (%s): list it once, with "
                         "its slots (%s:%d)", from, h->name[j], h->name[i], here ? "this one" : "the same address",
                         h->name[j], h->slots[j] + h->slots[i]);
                rc = -1;
            }
    }
    free(ad);
    return rc;
}

/* an IPv4 literal ("10.0.0.1", 127.x.x.x) one of this machine's interfaces
 * has (--hosts takes no IPv6: add_host refuses ':') */
static int local_address(const char *name) {
    struct in_addr want;
    if (inet_pton(AF_INET, name, &want) != 1) return 0;
    if ((ntohl(want.s_addr) >> 24) == 127) return 1;   /* loopback */
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs)) return 0;
    int found = 0;
    for (struct ifaddrs *i = ifs; i && !found; i = i->ifa_next)
        found = i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
                ((struct sockaddr_in *)(void *)i->ifa_addr)->sin_addr.s_addr == want.s_addr;
    freeifaddrs(ifs);
    return found;
}

/* Names only (no DNS: a name server must not delay a launch): "localhost",
 * this machine's host name, either one's short form ("node1" for
 * "node1.cluster" and the reverse), any case; an address of its own. */
int dt_cli_host_is_here(const char *name) {
    char me[256] = "";
    if (!strcasecmp(name, "localhost") || local_address(name)) return 1;
    if (gethostname(me, sizeof me - 1) || !*me) return 0;
    size_t a = strcspn(me, "."), b = strcspn(name, ".");
    return !strcasecmp(name, me) || (a == b && !strncasecmp(name, me, a) && (!me[a] || !name[b]));
}

int dt_cli_hosts_here(const dt_cli_hosts *h, int nproc) {
    if (h->n == 0 && !h->slurm) return 1;
    /* a Slurm batch script runs on the allocation's first node, which mpirun fills first */
    if (h->slurm) return getenv("SLURMD_NODENAME") != NULL;
    /* --map-by slot: the first hosts take the ranks; spare ones take none */
    for (int i = 0, placed = 0; i < h->n && placed < nproc; placed += h->slots[i++])
        if (dt_cli_host_is_here(h->name[i])) return 1;
    return 0;
}

int dt_cli_hosts_max_slots(const dt_cli_hosts *h) {
    int m = 0;
    for (int i = 0; i < h->n; i++) m = h->slots[i] > m ? h->slots[i] : m;
    return m;
}
