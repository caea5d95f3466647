// Command idempotency prints the golden idempotency keys of the personal
// stream's upstream subscriptions, computed by real Go the way the
// reference CLI computes them (DingTalk-Real-AI/dingtalk-workspace-cli @
// fcfead71, Apache-2.0): BuildFilter, normalizeFilterAliases,
// IdempotencyKey and CanonicalJSON are copied from
// internal/event/personal/registry.go, Identity.Key from
// internal/event/personal/client.go. The bus's unit test
// (busd/src/source/personal/control/golden_tests.rs) reads the output,
// goldens.json; scripts/goldens.sh regenerates it.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// ---- copied from the reference (registry.go, client.go) ----

type Identity struct {
	LocalSubject string
	CorpID       string
	UserID       string
	ClientID     string
	SourceID     string
}

func (i Identity) Key() string {
	corpID := strings.TrimSpace(i.CorpID)
	userID := strings.TrimSpace(i.UserID)
	clientID := strings.TrimSpace(i.ClientID)
	sourceID := strings.TrimSpace(i.SourceID)
	if corpID != "" && userID != "" {
		return strings.Join([]string{"corp_user", corpID, userID, clientID, sourceID}, "\x00")
	}
	if localSubject := strings.TrimSpace(i.LocalSubject); localSubject != "" {
		return strings.Join([]string{"local_subject", localSubject, clientID, sourceID}, "\x00")
	}
	return strings.Join([]string{"unknown", corpID, userID, clientID, sourceID}, "\x00")
}

var filterFieldAliases = map[string]string{
	"content":                 "payload.body.content",
	"conversation_id":         "payload.body.openConversationId",
	"sender":                  "payload.body.sender",
	"sender_open_dingtalk_id": "payload.body.senderOpenDingTalkId",
}

func normalizeFilterAliases(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, value := range x {
			if k == "field" {
				if raw, ok := value.(string); ok {
					if mapped, ok := filterFieldAliases[raw]; ok {
						value = mapped
					}
				}
			} else {
				value = normalizeFilterAliases(value)
			}
			out[k] = value
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, value := range x {
			out[i] = normalizeFilterAliases(value)
		}
		return out
	default:
		return v
	}
}

func BuildFilter(filterJSON string, queryCSV string) (any, string, error) {
	var parts []any
	filterJSON = strings.TrimSpace(filterJSON)
	if filterJSON != "" {
		var v any
		if err := json.Unmarshal([]byte(filterJSON), &v); err != nil {
			return nil, "", fmt.Errorf("--filter-json must be valid JSON: %w", err)
		}
		v = normalizeFilterAliases(v)
		parts = append(parts, v)
	}
	queries := splitCSV(queryCSV)
	if len(queries) > 0 {
		parts = append(parts, map[string]any{
			"field": "payload.body.content",
			"op":    "contains_any",
			"value": queries,
		})
	}
	switch len(parts) {
	case 0:
		return nil, "", nil
	case 1:
		canon, err := CanonicalJSON(parts[0])
		return parts[0], canon, err
	default:
		v := map[string]any{"and": parts}
		canon, err := CanonicalJSON(v)
		return v, canon, err
	}
}

func IdempotencyKey(identity Identity, eventKey, ruleType string, ruleParam map[string]any, filterCanonical string) string {
	ruleCanonical, _ := CanonicalJSON(ruleParam)
	sum := sha256.Sum256([]byte(strings.Join([]string{
		identity.Key(),
		eventKey,
		ruleType,
		ruleCanonical,
		filterCanonical,
	}, "\x00")))
	return "dws-cli-" + hex.EncodeToString(sum[:8])
}

func CanonicalJSON(v any) (string, error) {
	if v == nil {
		return "", nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

func splitCSV(raw string) []string {
	var out []string
	for _, part := range strings.Split(raw, ",") {
		part = strings.TrimSpace(part)
		if part != "" {
			out = append(out, part)
		}
	}
	return out
}

// ---- the cases ----

// A case is what a consumer gives (`dws event consume KEY --user …
// --filter-json … --query …`) and who the bus is.
type Case struct {
	Name           string `json:"name"`
	CorpID         string `json:"corp_id"`
	UserID         string `json:"user_id"`
	LocalSubject   string `json:"local_subject"`
	ClientID       string `json:"client_id"`
	SourceID       string `json:"source_id"`
	EventKey       string `json:"event_key"`
	RuleType       string `json:"rule_type"`
	User           string `json:"user"`
	OpenDingTalkID string `json:"open_dingtalk_id"`
	Group          string `json:"group"`
	FilterJSON     string `json:"filter_json"`
	Query          string `json:"query"`
	// Computed by Go.
	RuleCanonical   string `json:"rule_canonical"`
	FilterCanonical string `json:"filter_canonical"`
	Key             string `json:"key"`
}

func ruleParam(c Case) map[string]any {
	switch {
	case c.Group != "":
		return map[string]any{"openConversationId": c.Group}
	case c.OpenDingTalkID != "":
		return map[string]any{"targetUid": c.OpenDingTalkID, "targetUidType": "openDingtalkId"}
	case c.User != "":
		return map[string]any{"targetUid": c.User, "targetUidType": "staffId"}
	}
	return map[string]any{}
}

const (
	at    = "user_im_message_receive_at"
	o2o   = "user_im_message_receive_o2o"
	group = "user_im_message_receive_group"
	subj  = "refresh:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
)

func cases() []Case {
	base := func(name, filter, query string) Case {
		return Case{Name: name, LocalSubject: subj, ClientID: "dws-client", SourceID: "open",
			EventKey: at, RuleType: "at", FilterJSON: filter, Query: query}
	}
	cs := []Case{
		base("no filter", "", ""),
		base("floats", `{"field":"payload.score","op":"gt","value":[1.5,3.0,-0.25,100,1e21,1e20,1e-7,0.000001,123456789.125,-0]}`, ""),
		base("large integers lose precision as float64", `{"field":"payload.id","op":"eq","value":[9007199254740993,12345678901234567890]}`, ""),
		base("html characters", `{"field":"content","op":"contains","value":"<a href=\"x\">&amp;</a>"}`, ""),
		base("unicode", `{"field":"content","op":"contains_any","value":["é","中文","😀","\u2028\u2029","\u007f","\u0001\t\n"]}`, ""),
		base("nested objects, unsorted keys", `{"z":{"y":{"b":2,"a":1},"x":[{"d":null,"c":true}]},"a":false}`, ""),
		base("aliases in and", `{"and":[{"field":"sender","op":"eq","value":"u1"},{"or":[{"field":"conversation_id","op":"eq","value":"c"}]}]}`, ""),
		base("the and wrapper", `{"field":"sender_open_dingtalk_id","op":"eq","value":"od"}`, "deploy, 上线 ,<b>"),
		base("query only", "", "a,b,,c"),
		base("a filter that is an array", `[1,"two",{"three":3}]`, ""),
		base("a filter that is a string", `"just text"`, "q"),
		base("a filter that is a number", `42.50`, ""),
	}
	o := base("single chat, staff id", "", "")
	o.EventKey, o.RuleType, o.User = o2o, "singleChat", "u-1"
	cs = append(cs, o)
	o = base("single chat, open dingtalk id, corp and user", "", "")
	o.EventKey, o.RuleType, o.OpenDingTalkID, o.CorpID, o.UserID = o2o, "singleChat", "od<&>", "ding-corp", "user-7"
	cs = append(cs, o)
	g := base("group", `{"field":"content","op":"contains","value":"x"}`, "")
	g.EventKey, g.RuleType, g.Group = group, "group", "cid/+=="
	cs = append(cs, g)
	u := base("no identity at all", "", "")
	u.LocalSubject = ""
	cs = append(cs, u)
	return cs
}

func main() {
	out := cases()
	for i := range out {
		c := &out[i]
		id := Identity{LocalSubject: c.LocalSubject, CorpID: c.CorpID, UserID: c.UserID, ClientID: c.ClientID, SourceID: c.SourceID}
		_, canon, err := BuildFilter(c.FilterJSON, c.Query)
		if err != nil {
			fmt.Fprintln(os.Stderr, c.Name, err)
			os.Exit(1)
		}
		rp := ruleParam(*c)
		c.RuleCanonical, _ = CanonicalJSON(rp)
		c.FilterCanonical = canon
		c.Key = IdempotencyKey(id, c.EventKey, c.RuleType, rp, canon)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
