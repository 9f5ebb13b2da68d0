/*
 * nvtxlog.c -- an NVTX v3 tool for instrument's tests: every NVTX event becomes one JSON line.
 *
 * Any NVTX v3 instance in a process (each shared object that compiled the NVTX headers in,
 * e.g. the `nvtx` Python package's extension modules) dlopens the library named by
 * NVTX_INJECTION64_PATH at its first NVTX call and calls InitializeInjectionNvtx2 below,
 * which fills that instance's function tables with our handlers.
 *
 * Environment:
 *   NVTX_LOG        output file ("%p" becomes the pid); unset or empty: stderr
 *   NVTX_LOG_FLUSH  "0" buffers lines; anything else (the default) flushes every line
 *
 * Line format (keys always present unless noted):
 *   ev       init | domain | category | push | pop | start | end | mark
 *   domain   domain name, or null for the default (NULL-handle) domain
 *   msg      message text (registered strings resolved; pop: the popped range's message;
 *            category: the category name; end: null)
 *   cat      category id (0 = none)
 *   color    ARGB as an unsigned integer, or null when the event has no ARGB colour
 *   payload  integer or floating payload, or null
 *   pid, tid process id and kernel thread id
 *   t        CLOCK_MONOTONIC nanoseconds
 *   id       range id (start / end only)
 *   depth    push / pop only: nesting level in that domain on that thread before the push
 *            (after the pop), -1 for a pop with nothing open (then "unmatched": true)
 *   n        init only: how many NVTX instances have initialised this tool so far
 *
 * Build: gcc -shared -fPIC -O2 -I<dir holding nvtx3/> -o libnvtxlog.so nvtxlog.c -ldl -lpthread
 */
#define NVTX_NO_IMPL /* a tool needs the types and callback ids, not the implementation */
#include <nvtx3/nvToolsExt.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#define TOOL_EXPORT __attribute__((visibility("default")))

/* ------------------------------------------------------------------ output */

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER; /* guards the file, domains and counters */
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static FILE *log_file;
static char log_template[4096];
static int flush_each_line = 1;
static unsigned init_calls;
static unsigned long long range_counter;

static __thread long thread_id;

static long current_tid(void)
{
    if (!thread_id)
        thread_id = (long)syscall(SYS_gettid);
    return thread_id;
}

/* Expand %p in the template and open the result for appending; stderr if there is none. */
static void open_output(void)
{
    char path[4096];
    size_t used = 0;
    const char *src = log_template;

    if (log_file && log_file != stderr)
        fclose(log_file);
    log_file = NULL;
    if (*src) {
        while (*src && used + 24 < sizeof path) {
            if (src[0] == '%' && src[1] == 'p') {
                used += (size_t)snprintf(path + used, sizeof path - used, "%d", (int)getpid());
                src += 2;
            } else {
                path[used++] = *src++;
            }
        }
        path[used] = '\0';
        log_file = fopen(path, "a");
    }
    if (!log_file)
        log_file = stderr;
}

/* A growable line buffer: one fputs per event, written under log_lock. */
typedef struct {
    char *data;
    size_t len, cap;
} line_t;

static void line_reserve(line_t *line, size_t extra)
{
    if (line->len + extra + 1 <= line->cap)
        return;
    size_t cap = line->cap ? line->cap : 256;
    while (cap < line->len + extra + 1)
        cap *= 2;
    char *grown = realloc(line->data, cap);
    if (!grown)
        abort();
    line->data = grown;
    line->cap = cap;
}

static void line_printf(line_t *line, const char *fmt, ...)
{
    va_list args;
    char small[128];
    va_start(args, fmt);
    int need = vsnprintf(small, sizeof small, fmt, args);
    va_end(args);
    if (need < 0)
        return;
    line_reserve(line, (size_t)need);
    va_start(args, fmt);
    vsnprintf(line->data + line->len, (size_t)need + 1, fmt, args);
    va_end(args);
    line->len += (size_t)need;
}

/* Append ,"key":"escaped text" or ,"key":null. Bytes >= 0x80 pass through (UTF-8 stays UTF-8). */
static void line_string(line_t *line, const char *key, const char *text)
{
    if (!text) {
        line_printf(line, ",\"%s\":null", key);
        return;
    }
    line_printf(line, ",\"%s\":\"", key);
    for (const unsigned char *c = (const unsigned char *)text; *c; ++c) {
        if (*c == '"' || *c == '\\')
            line_printf(line, "\\%c", *c);
        else if (*c == '\n')
            line_printf(line, "\\n");
        else if (*c < 0x20)
            line_printf(line, "\\u%04x", *c);
        else
            line_printf(line, "%c", *c);
    }
    line_printf(line, "\"");
}

static void line_begin(line_t *line, const char *ev, const char *domain, const char *msg)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    line_printf(line, "{\"ev\":\"%s\"", ev);
    line_string(line, "domain", domain);
    line_string(line, "msg", msg);
    line_printf(line, ",\"pid\":%d,\"tid\":%ld,\"t\":%lld", (int)getpid(), current_tid(),
                (long long)now.tv_sec * 1000000000LL + now.tv_nsec);
}

/* Close the object and write the line; the caller holds no lock. */
static void line_emit(line_t *line)
{
    line_printf(line, "}\n");
    pthread_mutex_lock(&log_lock);
    fputs(line->data, log_file);
    if (flush_each_line)
        fflush(log_file);
    pthread_mutex_unlock(&log_lock);
    free(line->data);
}

/* ------------------------------------------------------------------ fork safety */

static void fork_prepare(void)
{
    pthread_mutex_lock(&log_lock);
    fflush(log_file);
}

static void fork_parent(void) { pthread_mutex_unlock(&log_lock); }

static void fork_child(void)
{
    pthread_mutex_init(&log_lock, NULL); /* the parent's holder does not exist here */
    thread_id = 0;
    if (strstr(log_template, "%p"))
        open_output(); /* the child gets a file of its own */
    flush_each_line = 1; /* children often leave through _exit(), which skips stdio flushing */
}

static void setup_once(void)
{
    const char *name = getenv("NVTX_LOG");
    const char *flush = getenv("NVTX_LOG_FLUSH");
    snprintf(log_template, sizeof log_template, "%s", name ? name : "");
    flush_each_line = !(flush && strcmp(flush, "0") == 0);
    open_output();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

/* ------------------------------------------------------------------ handles */

/* Domains are interned by name and never freed, so a handle stays valid after DomainDestroy
 * (NVTX instances of one process may create the same domain; events may outlive a destroy). */
typedef struct tool_domain {
    struct tool_domain *next;
    char *name;
} tool_domain_t;

typedef struct {
    char *text;
} tool_string_t;

static tool_domain_t *domains;

static const char *domain_name(nvtxDomainHandle_t handle)
{
    return handle ? ((const tool_domain_t *)handle)->name : NULL;
}

static char *wide_to_utf8(const wchar_t *wide)
{
    if (!wide)
        return strdup("");
    size_t n = wcstombs(NULL, wide, 0);
    if (n == (size_t)-1)
        return strdup("?");
    char *out = malloc(n + 1);
    if (!out)
        abort();
    wcstombs(out, wide, n + 1);
    return out;
}

/* The text of an event's message; *owned is set when the caller must free it. */
static const char *message_of(const nvtxEventAttributes_t *attr, char **owned)
{
    *owned = NULL;
    if (!attr)
        return NULL;
    switch (attr->messageType) {
    case NVTX_MESSAGE_TYPE_ASCII:
        return attr->message.ascii;
    case NVTX_MESSAGE_TYPE_UNICODE:
        return *owned = wide_to_utf8(attr->message.unicode);
    case NVTX_MESSAGE_TYPE_REGISTERED:
        return attr->message.registered ? ((const tool_string_t *)attr->message.registered)->text : NULL;
    default:
        return NULL;
    }
}

static void line_attributes(line_t *line, const nvtxEventAttributes_t *attr)
{
    line_printf(line, ",\"cat\":%u", attr ? attr->category : 0u);
    if (attr && attr->colorType == NVTX_COLOR_ARGB)
        line_printf(line, ",\"color\":%u", attr->color);
    else
        line_printf(line, ",\"color\":null");
    if (!attr) {
        line_printf(line, ",\"payload\":null");
        return;
    }
    switch (attr->payloadType) {
    case NVTX_PAYLOAD_TYPE_INT64:
        line_printf(line, ",\"payload\":%lld", (long long)attr->payload.llValue);
        break;
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT64:
        line_printf(line, ",\"payload\":%llu", (unsigned long long)attr->payload.ullValue);
        break;
    case NVTX_PAYLOAD_TYPE_INT32:
        line_printf(line, ",\"payload\":%d", attr->payload.iValue);
        break;
    case NVTX_PAYLOAD_TYPE_UNSIGNED_INT32:
        line_printf(line, ",\"payload\":%u", attr->payload.uiValue);
        break;
    case NVTX_PAYLOAD_TYPE_DOUBLE:
        line_printf(line, ",\"payload\":%.17g", attr->payload.dValue);
        break;
    case NVTX_PAYLOAD_TYPE_FLOAT:
        line_printf(line, ",\"payload\":%.9g", (double)attr->payload.fValue);
        break;
    default: /* none, or an extended (binary) payload we do not decode */
        line_printf(line, ",\"payload\":null");
        break;
    }
}

/* ------------------------------------------------------------------ per-thread push/pop stacks */

typedef struct {
    const void *domain;
    char *msg;
} open_range_t;

static __thread open_range_t *open_ranges;
static __thread size_t open_count, open_cap;

static int level_in(const void *domain, size_t below)
{
    int level = 0;
    for (size_t i = 0; i < below; ++i)
        level += open_ranges[i].domain == domain;
    return level;
}

/* ------------------------------------------------------------------ events */

static int on_push(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *attr)
{
    char *owned;
    const char *msg = message_of(attr, &owned);
    int level = level_in(domain, open_count);
    if (open_count == open_cap) {
        size_t cap = open_cap ? open_cap * 2 : 16;
        open_range_t *grown = realloc(open_ranges, cap * sizeof *grown);
        if (!grown)
            abort();
        open_ranges = grown;
        open_cap = cap;
    }
    open_ranges[open_count].domain = domain;
    open_ranges[open_count].msg = msg ? strdup(msg) : NULL;
    ++open_count;

    line_t line = {0};
    line_begin(&line, "push", domain_name(domain), msg);
    line_attributes(&line, attr);
    line_printf(&line, ",\"depth\":%d", level);
    line_emit(&line);
    free(owned);
    return level;
}

static int on_pop(nvtxDomainHandle_t domain)
{
    line_t line = {0};
    size_t i = open_count;
    while (i > 0 && open_ranges[i - 1].domain != (const void *)domain)
        --i;
    if (i == 0) {
        line_begin(&line, "pop", domain_name(domain), NULL);
        line_printf(&line, ",\"cat\":0,\"color\":null,\"payload\":null,\"depth\":-1,\"unmatched\":true");
        line_emit(&line);
        return -1;
    }
    open_range_t top = open_ranges[i - 1];
    memmove(&open_ranges[i - 1], &open_ranges[i], (open_count - i) * sizeof *open_ranges);
    --open_count;
    int level = level_in(domain, i - 1);
    line_begin(&line, "pop", domain_name(domain), top.msg);
    line_printf(&line, ",\"cat\":0,\"color\":null,\"payload\":null,\"depth\":%d", level);
    line_emit(&line);
    free(top.msg);
    return level;
}

static nvtxRangeId_t on_start(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *attr)
{
    char *owned;
    const char *msg = message_of(attr, &owned);
    nvtxRangeId_t id = __atomic_add_fetch(&range_counter, 1, __ATOMIC_RELAXED);
    line_t line = {0};
    line_begin(&line, "start", domain_name(domain), msg);
    line_attributes(&line, attr);
    line_printf(&line, ",\"id\":%llu", (unsigned long long)id);
    line_emit(&line);
    free(owned);
    return id;
}

static void on_end(nvtxDomainHandle_t domain, nvtxRangeId_t id)
{
    line_t line = {0};
    line_begin(&line, "end", domain_name(domain), NULL);
    line_printf(&line, ",\"cat\":0,\"color\":null,\"payload\":null,\"id\":%llu", (unsigned long long)id);
    line_emit(&line);
}

static void on_mark(nvtxDomainHandle_t domain, const nvtxEventAttributes_t *attr)
{
    char *owned;
    const char *msg = message_of(attr, &owned);
    line_t line = {0};
    line_begin(&line, "mark", domain_name(domain), msg);
    line_attributes(&line, attr);
    line_emit(&line);
    free(owned);
}

static void on_category(nvtxDomainHandle_t domain, uint32_t category, const char *name)
{
    line_t line = {0};
    line_begin(&line, "category", domain_name(domain), name);
    line_printf(&line, ",\"cat\":%u,\"color\":null,\"payload\":null", category);
    line_emit(&line);
}

/* Plain (CORE) API: the default domain, message given inline. */
static nvtxEventAttributes_t ascii_attributes(const char *msg)
{
    nvtxEventAttributes_t attr;
    memset(&attr, 0, sizeof attr);
    attr.version = NVTX_VERSION;
    attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
    attr.message.ascii = msg;
    return attr;
}

static void NVTX_API core_mark_ex(const nvtxEventAttributes_t *a) { on_mark(NULL, a); }
static void NVTX_API core_mark_a(const char *m)
{
    nvtxEventAttributes_t a = ascii_attributes(m);
    on_mark(NULL, &a);
}
static nvtxRangeId_t NVTX_API core_start_ex(const nvtxEventAttributes_t *a) { return on_start(NULL, a); }
static nvtxRangeId_t NVTX_API core_start_a(const char *m)
{
    nvtxEventAttributes_t a = ascii_attributes(m);
    return on_start(NULL, &a);
}
static void NVTX_API core_end(nvtxRangeId_t id) { on_end(NULL, id); }
static int NVTX_API core_push_ex(const nvtxEventAttributes_t *a) { return on_push(NULL, a); }
static int NVTX_API core_push_a(const char *m)
{
    nvtxEventAttributes_t a = ascii_attributes(m);
    return on_push(NULL, &a);
}
static int NVTX_API core_pop(void) { return on_pop(NULL); }
static void NVTX_API core_name_category_a(uint32_t c, const char *n) { on_category(NULL, c, n); }

/* Domain (CORE2) API: what the `nvtx` Python package calls. */
static void NVTX_API domain_mark_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { on_mark(d, a); }
static nvtxRangeId_t NVTX_API domain_start_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a)
{
    return on_start(d, a);
}
static void NVTX_API domain_end(nvtxDomainHandle_t d, nvtxRangeId_t id) { on_end(d, id); }
static int NVTX_API domain_push_ex(nvtxDomainHandle_t d, const nvtxEventAttributes_t *a) { return on_push(d, a); }
static int NVTX_API domain_pop(nvtxDomainHandle_t d) { return on_pop(d); }
static void NVTX_API domain_name_category_a(nvtxDomainHandle_t d, uint32_t c, const char *n) { on_category(d, c, n); }

static nvtxStringHandle_t register_owned(char *text)
{
    tool_string_t *handle = malloc(sizeof *handle); /* lives as long as the process */
    if (!handle || !text)
        abort();
    handle->text = text;
    return (nvtxStringHandle_t)handle;
}

static nvtxStringHandle_t NVTX_API domain_register_string_a(nvtxDomainHandle_t d, const char *s)
{
    (void)d;
    return register_owned(strdup(s ? s : ""));
}

static nvtxStringHandle_t NVTX_API domain_register_string_w(nvtxDomainHandle_t d, const wchar_t *s)
{
    (void)d;
    return register_owned(wide_to_utf8(s));
}

static nvtxDomainHandle_t NVTX_API domain_create_a(const char *name)
{
    const char *wanted = name ? name : "";
    tool_domain_t *found;
    int created = 0;
    pthread_mutex_lock(&log_lock);
    for (found = domains; found && strcmp(found->name, wanted) != 0; found = found->next) {
    }
    if (!found) {
        found = calloc(1, sizeof *found);
        if (!found || !(found->name = strdup(wanted)))
            abort();
        found->next = domains;
        domains = found;
        created = 1;
    }
    pthread_mutex_unlock(&log_lock);
    line_t line = {0};
    line_begin(&line, "domain", found->name, found->name);
    line_printf(&line, ",\"cat\":0,\"color\":null,\"payload\":null,\"new\":%s", created ? "true" : "false");
    line_emit(&line);
    return (nvtxDomainHandle_t)found;
}

static void NVTX_API domain_destroy(nvtxDomainHandle_t d) { (void)d; /* interned: kept for late events */ }
static void NVTX_API domain_initialize(const void *reserved) { (void)reserved; }

/* ------------------------------------------------------------------ entry point */

static void install(NvtxFunctionTable table, unsigned size, unsigned id, NvtxFunctionPointer fn)
{
    if (id < size && table[id])
        *table[id] = fn;
}

#define INSTALL(table, size, id, fn) install((table), (size), (id), (NvtxFunctionPointer)(fn))

/* Called once by every NVTX instance that loads this library: must be safe to call repeatedly. */
TOOL_EXPORT int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_export_table)
{
    pthread_once(&log_once, setup_once);

    const NvtxExportTableCallbacks *callbacks =
        (const NvtxExportTableCallbacks *)get_export_table(NVTX_ETID_CALLBACKS);
    if (!callbacks || callbacks->struct_size < sizeof *callbacks || !callbacks->GetModuleFunctionTable)
        return 0;
    const NvtxExportTableVersionInfo *version =
        (const NvtxExportTableVersionInfo *)get_export_table(NVTX_ETID_VERSIONINFO);
    if (version && version->struct_size >= sizeof *version && version->SetInjectionNvtxVersion)
        version->SetInjectionNvtxVersion(NVTX_VERSION);

    NvtxFunctionTable table = NULL;
    unsigned size = 0;
    if (callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size) && table) {
        INSTALL(table, size, NVTX_CBID_CORE_MarkEx, core_mark_ex);
        INSTALL(table, size, NVTX_CBID_CORE_MarkA, core_mark_a);
        INSTALL(table, size, NVTX_CBID_CORE_RangeStartEx, core_start_ex);
        INSTALL(table, size, NVTX_CBID_CORE_RangeStartA, core_start_a);
        INSTALL(table, size, NVTX_CBID_CORE_RangeEnd, core_end);
        INSTALL(table, size, NVTX_CBID_CORE_RangePushEx, core_push_ex);
        INSTALL(table, size, NVTX_CBID_CORE_RangePushA, core_push_a);
        INSTALL(table, size, NVTX_CBID_CORE_RangePop, core_pop);
        INSTALL(table, size, NVTX_CBID_CORE_NameCategoryA, core_name_category_a);
    }
    table = NULL;
    size = 0;
    if (!callbacks->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &table, &size) || !table)
        return 0;
    INSTALL(table, size, NVTX_CBID_CORE2_DomainMarkEx, domain_mark_ex);
    INSTALL(table, size, NVTX_CBID_CORE2_DomainRangeStartEx, domain_start_ex);
    INSTALL(table, size, NVTX_CBID_CORE2_DomainRangeEnd, domain_end);
    INSTALL(table, size, NVTX_CBID_CORE2_DomainRangePushEx, domain_push_ex);
    INSTALL(table, size, NVTX_CBID_CORE2_DomainRangePop, domain_pop);
    INSTALL(table, size, NVTX_CBID_CORE2_DomainNameCategoryA, domain_name_category_a);
    INSTALL(table, size, NVTX_CBID_CORE2_DomainRegisterStringA, domain_register_string_a);
    INSTALL(table, size, NVTX_CBID_CORE2_DomainRegisterStringW, domain_register_string_w);
    INSTALL(table, size, NVTX_CBID_CORE2_DomainCreateA, domain_create_a);
    INSTALL(table, size, NVTX_CBID_CORE2_DomainDestroy, domain_destroy);
    INSTALL(table, size, NVTX_CBID_CORE2_Initialize, domain_initialize);

    unsigned calls = __atomic_add_fetch(&init_calls, 1, __ATOMIC_RELAXED);
    line_t line = {0};
    line_begin(&line, "init", NULL, NULL);
    line_printf(&line, ",\"cat\":0,\"color\":null,\"payload\":null,\"n\":%u,\"nvtx_version\":%u", calls,
                version && version->struct_size >= sizeof *version ? version->version : 0u);
    line_emit(&line);
    return 1; /* success: slots we left alone stay no-ops */
}
