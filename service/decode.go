package service

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/reservebench/reservebench/strategy"
)

// InputError is a request refused before anything was admitted: the body
// could not be read, is not in an accepted form, or a field is missing or
// invalid. Status is the HTTP status it is answered with.
type InputError struct {
	Status int    // 400, 408, 413 or 415
	Field  string // the field in the API's names (request_key, user, sku, ttl_ms), or "" for the body
	Reason string
}

func (e *InputError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%d %s: %s", e.Status, http.StatusText(e.Status), e.Reason)
	}
	return fmt.Sprintf("%d %s: %s: %s", e.Status, http.StatusText(e.Status), e.Field, e.Reason)
}

// Is makes errors.Is(err, strategy.ErrBadRequest) true: nothing was written.
func (e *InputError) Is(target error) bool { return target == strategy.ErrBadRequest }

// Outcome names the refusal in an answer's outcome field.
func (e *InputError) Outcome() string {
	switch e.Status {
	case http.StatusRequestEntityTooLarge:
		return "BODY_TOO_LARGE"
	case http.StatusUnsupportedMediaType:
		return "UNSUPPORTED_MEDIA_TYPE"
	case http.StatusRequestTimeout:
		return "REQUEST_TIMEOUT"
	}
	return string(strategy.OutcomeBadRequest)
}

func badField(field, format string, args ...any) *InputError {
	return &InputError{Status: http.StatusBadRequest, Field: field, Reason: fmt.Sprintf(format, args...)}
}

func badBody(status int, format string, args ...any) *InputError {
	return &InputError{Status: status, Reason: fmt.Sprintf(format, args...)}
}

// The fields of POST /reserve, in the seed's names.
var reserveFields = []string{"request_key", "user", "sku", "ttl_ms"}

// apiField maps a strategy.RequestError field to the API's name.
var apiField = map[string]string{"key": "request_key", "user": "user", "sku": "sku", "ttl": "ttl_ms"}

// decodeReserve reads and checks the body of POST /reserve: a form body
// (the seed's) or a JSON object, each with exactly the four fields. The
// request it returns has passed strategy.Request.Validate.
func decodeReserve(w http.ResponseWriter, r *http.Request, maxBody int64) (strategy.Request, error) {
	kind, err := contentKind(r.Header.Get("Content-Type"))
	if err != nil {
		return strategy.Request{}, err
	}
	body, err := readBody(w, r, maxBody)
	if err != nil {
		return strategy.Request{}, err
	}
	// encoding/json and url.ParseQuery both accept invalid UTF-8 (JSON
	// turns it into U+FFFD, silently changing a key), so it is refused here.
	if !utf8.Valid(body) {
		return strategy.Request{}, badBody(http.StatusBadRequest, "body is not valid UTF-8")
	}
	var f fields
	if kind == "json" {
		f, err = decodeJSON(body)
	} else {
		f, err = decodeForm(body)
	}
	if err != nil {
		return strategy.Request{}, err
	}
	req := strategy.Request{Key: f.key, User: f.user, SKU: f.sku, TTL: time.Duration(f.ttlMs) * time.Millisecond}
	if err := req.Validate(); err != nil {
		var re *strategy.RequestError
		if errors.As(err, &re) {
			return strategy.Request{}, badField(apiField[re.Field], "%s", re.Reason)
		}
		return strategy.Request{}, badBody(http.StatusBadRequest, "%v", err)
	}
	return req, nil
}

// maxTTLms is strategy.MaxTTL in the API's unit.
var maxTTLms = strategy.MaxTTL.Milliseconds()

type fields struct {
	key, user, sku string
	ttlMs          int64
}

// contentKind accepts exactly the two media types of the API, with at most
// a UTF-8 charset.
func contentKind(header string) (string, error) {
	if header == "" {
		return "", badBody(http.StatusUnsupportedMediaType, "no Content-Type: send application/x-www-form-urlencoded or application/json")
	}
	mt, params, err := mime.ParseMediaType(header)
	if err != nil {
		return "", badBody(http.StatusUnsupportedMediaType, "Content-Type %q: %v", header, err)
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return "", badBody(http.StatusUnsupportedMediaType, "Content-Type parameter %s=%s: only charset=utf-8 is accepted", k, v)
		}
	}
	switch mt {
	case "application/x-www-form-urlencoded":
		return "form", nil
	case "application/json":
		return "json", nil
	}
	return "", badBody(http.StatusUnsupportedMediaType, "Content-Type %s: send application/x-www-form-urlencoded or application/json", mt)
}

// readBody reads the whole body, at most max bytes. The server's
// ReadTimeout bounds a slow or unfinished one.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, max))
	var tooLarge *http.MaxBytesError
	var netErr net.Error
	switch {
	case err == nil:
		if len(b) == 0 {
			return nil, badBody(http.StatusBadRequest, "empty body")
		}
		return b, nil
	case errors.As(err, &tooLarge):
		return nil, badBody(http.StatusRequestEntityTooLarge, "body longer than %d bytes", max)
	case errors.As(err, &netErr) && netErr.Timeout():
		return nil, badBody(http.StatusRequestTimeout, "the body did not arrive within the server's read timeout")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return nil, badBody(http.StatusBadRequest, "the body ended before its Content-Length")
	}
	return nil, badBody(http.StatusBadRequest, "reading the body: %v", err)
}

func decodeForm(body []byte) (fields, error) {
	vals, err := url.ParseQuery(string(body))
	if err != nil {
		return fields{}, badBody(http.StatusBadRequest, "form body: %v", err)
	}
	var f fields
	for name, vs := range vals {
		if !isReserveField(name) {
			return fields{}, badField(name, "unknown field (want %s)", strings.Join(reserveFields, ", "))
		}
		if len(vs) > 1 {
			return fields{}, badField(name, "given %d times", len(vs))
		}
	}
	f.key, f.user, f.sku = vals.Get("request_key"), vals.Get("user"), vals.Get("sku")
	ttl, ok := vals["ttl_ms"]
	if !ok || ttl[0] == "" {
		return fields{}, badField("ttl_ms", "missing")
	}
	n, err := strconv.ParseInt(ttl[0], 10, 64)
	if err != nil {
		return fields{}, badField("ttl_ms", "not a whole number of milliseconds: %q", ttl[0])
	}
	if err := checkTTL(n); err != nil {
		return fields{}, err
	}
	f.ttlMs = n
	return f, nil
}

func checkTTL(ms int64) error {
	if ms < 1 || ms > maxTTLms {
		return badField("ttl_ms", "must be 1..%d, got %d", maxTTLms, ms)
	}
	return nil
}

func isReserveField(name string) bool {
	for _, f := range reserveFields {
		if f == name {
			return true
		}
	}
	return false
}

// decodeJSON decodes one JSON object with exactly the four fields, each
// once, spelt exactly, of the right type, and nothing after it.
func decodeJSON(body []byte) (fields, error) {
	if err := checkJSONNames(body); err != nil {
		return fields{}, err
	}
	var in struct {
		RequestKey *string `json:"request_key"`
		User       *string `json:"user"`
		SKU        *string `json:"sku"`
		TTLms      *int64  `json:"ttl_ms"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fields{}, badField(te.Field, "wrong type: got a JSON %s, want %s", te.Value, jsonType(te.Type.String()))
		}
		return fields{}, badBody(http.StatusBadRequest, "JSON body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fields{}, badBody(http.StatusBadRequest, "JSON body: something follows the object")
	}
	f := fields{key: deref(in.RequestKey), user: deref(in.User), sku: deref(in.SKU)}
	if in.TTLms == nil {
		return fields{}, badField("ttl_ms", "missing")
	}
	if err := checkTTL(*in.TTLms); err != nil {
		return fields{}, err
	}
	f.ttlMs = *in.TTLms
	return f, nil
}

// checkJSONNames walks the top level of the body: it must be one object
// whose member names are the API's fields, each at most once. It is
// written here because encoding/json matches names case-insensitively and
// lets a repeated name overwrite the first, and a request key must not
// depend on which of two values wins.
func checkJSONNames(body []byte) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return badBody(http.StatusBadRequest, "JSON body: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return badBody(http.StatusBadRequest, "JSON body: want an object, got %v", tok)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return badBody(http.StatusBadRequest, "JSON body: %v", err)
		}
		name, _ := tok.(string)
		if !isReserveField(name) {
			return badField(name, "unknown field (want %s)", strings.Join(reserveFields, ", "))
		}
		if seen[name] {
			return badField(name, "given twice")
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return badBody(http.StatusBadRequest, "JSON body: %v", err)
		}
	}
	if _, err := dec.Token(); err != nil {
		return badBody(http.StatusBadRequest, "JSON body: %v", err)
	}
	return nil
}

func jsonType(goType string) string {
	switch goType {
	case "int64":
		return "a whole number"
	case "string":
		return "a string"
	}
	return goType
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// checkKey checks a request key taken from the path, with the rules of
// strategy.Request.Validate for keys.
func checkKey(key string) error {
	r := strategy.Request{Key: key, User: "u", SKU: "s", TTL: time.Second}
	if err := r.Validate(); err != nil {
		var re *strategy.RequestError
		if errors.As(err, &re) {
			return badField("request_key", "%s", re.Reason)
		}
		return badField("request_key", "%v", err)
	}
	return nil
}
