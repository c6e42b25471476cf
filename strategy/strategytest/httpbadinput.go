package strategytest

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/reservebench/reservebench/strategy"
)

// badHTTP is one malformed request to the front and how it must be
// answered. Each is built around a valid request with a key of its own, so
// the harness can look the key up afterwards.
type badHTTP struct {
	name string
	// build returns the bytes sent on a connection of their own, and
	// whether the client then closes its sending side.
	build func(valid strategy.Request) (data []byte, halfClose bool)
	code  int    // the status; 0: the server closes without an answer
	field string // the field the answer names, or "" for the body
}

const formType = "application/x-www-form-urlencoded"

// form is a form body from the valid request with changes: a value
// replaces a field, "-" removes it; extra raw text is appended.
func form(valid strategy.Request, change map[string]string, extra string) []byte {
	fields := map[string]string{"request_key": valid.Key, "user": valid.User, "sku": valid.SKU, "ttl_ms": fmt.Sprint(valid.TTL.Milliseconds())}
	var parts []string
	for _, name := range reserveOrder {
		v, ok := change[name]
		switch {
		case !ok:
			v = fields[name]
		case v == "-":
			continue
		}
		parts = append(parts, name+"="+v)
	}
	s := strings.Join(parts, "&")
	if extra != "" {
		s += "&" + extra
	}
	return []byte(s)
}

var reserveOrder = []string{"request_key", "user", "sku", "ttl_ms"}

func formReq(change map[string]string, extra string) func(strategy.Request) ([]byte, bool) {
	return func(v strategy.Request) ([]byte, bool) { return rawPost(formType, form(v, change, extra), -1), false }
}

func jsonReq(body func(v strategy.Request) string) func(strategy.Request) ([]byte, bool) {
	return func(v strategy.Request) ([]byte, bool) {
		return rawPost("application/json", []byte(body(v)), -1), false
	}
}

func validJSON(v strategy.Request) string {
	return fmt.Sprintf(`{"request_key":%q,"user":%q,"sku":%q,"ttl_ms":%d}`, v.Key, v.User, v.SKU, v.TTL.Milliseconds())
}

func rawGet(path string) func(strategy.Request) ([]byte, bool) {
	return func(strategy.Request) ([]byte, bool) {
		return []byte("GET " + path + " HTTP/1.1\r\nHost: front\r\nConnection: close\r\n\r\n"), false
	}
}

var badHTTPRequests = []badHTTP{
	{"form: request_key missing", formReq(map[string]string{"request_key": "-"}, ""), 400, "request_key"},
	{"form: user empty", formReq(map[string]string{"user": ""}, ""), 400, "user"},
	{"form: sku missing", formReq(map[string]string{"sku": "-"}, ""), 400, "sku"},
	{"form: ttl_ms missing", formReq(map[string]string{"ttl_ms": "-"}, ""), 400, "ttl_ms"},
	{"form: ttl_ms not a number", formReq(map[string]string{"ttl_ms": "soon"}, ""), 400, "ttl_ms"},
	{"form: ttl_ms fractional", formReq(map[string]string{"ttl_ms": "1.5"}, ""), 400, "ttl_ms"},
	{"form: ttl_ms zero", formReq(map[string]string{"ttl_ms": "0"}, ""), 400, "ttl_ms"},
	{"form: ttl_ms negative", formReq(map[string]string{"ttl_ms": "-5"}, ""), 400, "ttl_ms"},
	{"form: ttl_ms over 24 h", formReq(map[string]string{"ttl_ms": "86400001"}, ""), 400, "ttl_ms"},
	{"form: unknown field", formReq(nil, "color=red"), 400, "color"},
	{"form: request_key twice", formReq(nil, "request_key=other"), 400, "request_key"},
	{"form: broken percent-escape", formReq(map[string]string{"user": "user%zz"}, ""), 400, ""},
	{"form: user not UTF-8 once decoded", formReq(map[string]string{"user": "user%FF"}, ""), 400, "user"},
	{"form: control character in request_key", formReq(map[string]string{"request_key": "req%01x"}, ""), 400, "request_key"},
	{"form: request_key over 128 bytes", formReq(map[string]string{"request_key": strings.Repeat("k", strategy.MaxKeyLen+1)}, ""), 400, "request_key"},
	{"body not UTF-8", func(v strategy.Request) ([]byte, bool) {
		return rawPost(formType, append(form(v, nil, ""), "&x=\xff"...), -1), false
	}, 400, ""},
	{"empty body", func(strategy.Request) ([]byte, bool) { return rawPost(formType, nil, -1), false }, 400, ""},
	{"json: ttl_ms a string", jsonReq(func(v strategy.Request) string {
		return fmt.Sprintf(`{"request_key":%q,"user":%q,"sku":%q,"ttl_ms":"60000"}`, v.Key, v.User, v.SKU)
	}), 400, "ttl_ms"},
	{"json: user a number", jsonReq(func(v strategy.Request) string {
		return fmt.Sprintf(`{"request_key":%q,"user":42,"sku":%q,"ttl_ms":60000}`, v.Key, v.SKU)
	}), 400, "user"},
	{"json: request_key null", jsonReq(func(v strategy.Request) string {
		return fmt.Sprintf(`{"request_key":null,"user":%q,"sku":%q,"ttl_ms":60000}`, v.User, v.SKU)
	}), 400, "request_key"},
	{"json: a second root value", jsonReq(func(v strategy.Request) string { return validJSON(v) + validJSON(v) }), 400, ""},
	{"json: trailing characters", jsonReq(func(v strategy.Request) string { return validJSON(v) + " x" }), 400, ""},
	{"json: unknown field", jsonReq(func(v strategy.Request) string {
		return strings.TrimSuffix(validJSON(v), "}") + `,"color":"red"}`
	}), 400, "color"},
	{"json: field name in another case", jsonReq(func(v strategy.Request) string {
		return strings.Replace(validJSON(v), `"request_key"`, `"Request_Key"`, 1)
	}), 400, "Request_Key"},
	{"json: field given twice", jsonReq(func(v strategy.Request) string {
		return strings.TrimSuffix(validJSON(v), "}") + `,"request_key":"other"}`
	}), 400, "request_key"},
	{"json: unfinished object", jsonReq(func(v strategy.Request) string { return validJSON(v)[:20] }), 400, ""},
	{"json: an array", jsonReq(func(v strategy.Request) string { return "[" + validJSON(v) + "]" }), 400, ""},
	{"body over the limit (413)", func(v strategy.Request) ([]byte, bool) {
		return rawPost(formType, form(v, nil, "pad="+strings.Repeat("p", 8<<10)), -1), false
	}, 413, ""},
	{"Content-Type text/plain (415)", func(v strategy.Request) ([]byte, bool) { return rawPost("text/plain", form(v, nil, ""), -1), false }, 415, ""},
	{"no Content-Type (415)", func(v strategy.Request) ([]byte, bool) { return rawPost("", form(v, nil, ""), -1), false }, 415, ""},
	{"charset latin1 (415)", func(v strategy.Request) ([]byte, bool) {
		return rawPost(formType+"; charset=iso-8859-1", form(v, nil, ""), -1), false
	}, 415, ""},
	{"body slower than the read timeout (408)", func(v strategy.Request) ([]byte, bool) {
		b := form(v, nil, "")
		return rawPost(formType, b[:len(b)/2], len(b)), false
	}, 408, ""},
	{"body cut short by the client", func(v strategy.Request) ([]byte, bool) {
		b := form(v, nil, "")
		return rawPost(formType, b[:len(b)/2], len(b)), true
	}, 400, ""},
	{"headers never finished (closed by the read timeout)", func(strategy.Request) ([]byte, bool) {
		return []byte("POST /reserve HTTP/1.1\r\nHost: front\r\nContent-Type: " + formType + "\r\n"), false
	}, 0, ""},
	{"GET: control character in the key", func(v strategy.Request) ([]byte, bool) {
		return rawGet("/reservations/" + url.PathEscape(v.Key+"\x01"))(v)
	}, 400, "request_key"},
	{"GET: key over 128 bytes", func(v strategy.Request) ([]byte, bool) {
		return rawGet("/reservations/" + strings.Repeat("k", strategy.MaxKeyLen+1))(v)
	}, 400, "request_key"},
}

// runHTTPBadInput sends each malformed request to the front on a
// connection of its own: each must get its status and a JSON answer naming
// the refusal, nothing may reach the gate or the strategy, nothing is
// written; a valid request afterwards is 201.
func runHTTPBadInput(ctx context.Context, t *trial) error {
	f, err := t.startFront(frontOptions{limits: t.in.limits(), read: millis(t.in.ReadTimeoutMs)})
	if err != nil {
		return err
	}
	defer f.close() //nolint:errcheck // closed below; this is for the error paths
	before, err := t.audit(ctx)
	if err != nil {
		return err
	}
	sku := t.sku(t.in.Stock[0].SKU)
	var wrong, written []string
	byCode := map[int]int{}
	var keys []string
	stalled := 0
	for i, b := range badHTTPRequests {
		valid := strategy.Request{Key: t.key(fmt.Sprintf("req-bad-%02d", i)), User: t.user("user-0042"), SKU: sku, TTL: time.Minute}
		keys = append(keys, valid.Key)
		data, half := b.build(valid)
		a, err := f.raw(data, half)
		// A request whose whole text is written at once and still meets the
		// read timeout met a stall of the client between its dial and its
		// write (a loaded machine); it is sent again, once, on a new
		// connection. A front that times out a request it had whole still
		// fails: it does so again.
		if err == nil && b.code != http.StatusRequestTimeout && b.code != 0 && a.code == http.StatusRequestTimeout {
			stalled++
			a, err = f.raw(data, half)
		}
		switch {
		case err != nil:
			wrong = append(wrong, fmt.Sprintf("%s: %v", b.name, err))
		case a.code != b.code:
			wrong = append(wrong, fmt.Sprintf("%s: got %v, want %d", b.name, a, b.code))
		case b.code != 0 && (a.Outcome == "" || a.Error == "" || a.Field != b.field):
			wrong = append(wrong, fmt.Sprintf("%s: answer %v names field %q with error %q, want field %q", b.name, a, a.Field, a.Error, b.field))
		}
		byCode[a.code]++
	}
	st := f.svc.Stats()
	calls := f.work.total()
	durable, err := t.lookupAll(ctx, keys)
	if err != nil {
		return err
	}
	for i, k := range keys {
		if durable[k].Status != strategy.StatusNotFound {
			written = append(written, badHTTPRequests[i].name)
		}
	}
	after, err := t.audit(ctx)
	if err != nil {
		return err
	}
	for _, s := range t.cfg.Stock {
		b, a := before[s.SKU], after[s.SKU]
		if b.Available != a.Available || b.Active != a.Active {
			written = append(written, fmt.Sprintf("audit of %s changed: available %d -> %d, active %d -> %d", t.plain(s.SKU), b.Available, a.Available, b.Active, a.Active))
		}
	}
	good := strategy.Request{Key: t.key("req-good"), User: t.user("user-0042"), SKU: sku, TTL: time.Minute}
	op := Op{Process: "c", Req: good, Invoke: t.hist.Begin()}
	ok, err := f.reserve(ctx, good)
	t.hist.End(httpOp(op, ok, err))
	if err := f.close(); err != nil {
		return err
	}

	var codes []string
	for c, n := range byCode {
		label := fmt.Sprint(c)
		if c == 0 {
			label = "closed without an answer"
		}
		codes = append(codes, fmt.Sprintf("%s x%d", label, n))
	}
	sort.Strings(codes)
	t.vary("malformed HTTP requests sent again after a read timeout their whole text should not have met", stalled)
	n := len(badHTTPRequests)
	t.fact("malformed HTTP requests answered as expected", "%d of %d (%s)", n-len(wrong), n, strings.Join(codes, ", "))
	t.check(Base, "a malformed HTTP request gets its status and a JSON answer naming the refusal", len(wrong) == 0, strings.Join(wrong, "; "))
	admitted := st.Gate.Admitted + st.Gate.AdmittedAfterWait
	t.check(Base, "a malformed HTTP request reaches neither the gate nor the strategy", admitted == 0 && calls == 0,
		fmt.Sprintf("the gate admitted %d, the strategy got %d Reserve calls", admitted, calls))
	t.check(Base, "a malformed HTTP request writes nothing", len(written) == 0, strings.Join(written, "; "))
	t.check(Base, "a valid request after malformed ones is 201 HELD", err == nil && ok.code == http.StatusCreated, fmt.Sprintf("got %v %v", ok, err))
	return nil
}
