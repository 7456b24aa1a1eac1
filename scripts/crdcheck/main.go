// crdcheck checks what kubernetes-validate cannot: the Prometheus Operator's custom resources
// (ServiceMonitor, PrometheusRule; their schemas are not among Kubernetes' own) and PromQL.
//
//	crdcheck objects RENDERED.yaml...   every monitoring.coreos.com/v1 object, decoded strictly
//	                                    into the operator's own Go types (an unknown or misspelt
//	                                    field fails, as does a wrong type), and each rule's expr
//	                                    parsed by Prometheus' PromQL parser
//	crdcheck dashboard DASHBOARD.json   every panel query parsed as PromQL (Grafana's variables
//	                                    replaced by values of their kind)
//
// Both print the metric names the expressions select, one per line, for check-deploy.sh to
// compare with src/ops/metrics.rs. Objects of other API groups are left to kubernetes-validate;
// an unknown kind of monitoring.coreos.com fails (it would otherwise pass unchecked).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: crdcheck objects FILE... | crdcheck dashboard FILE")
		os.Exit(2)
	}
	metrics := map[string]bool{}
	var err error
	switch os.Args[1] {
	case "objects":
		for _, f := range os.Args[2:] {
			if err = checkObjects(f, metrics); err != nil {
				break
			}
		}
	case "dashboard":
		err = checkDashboard(os.Args[2], metrics)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "crdcheck:", err)
		os.Exit(1)
	}
	names := make([]string, 0, len(metrics))
	for m := range metrics {
		names = append(names, m)
	}
	sort.Strings(names)
	for _, m := range names {
		fmt.Println(m)
	}
}

// checkObjects decodes every monitoring.coreos.com document of a multi-document YAML file.
func checkObjects(path string, metrics map[string]bool) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for i, doc := range splitDocuments(raw) {
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return fmt.Errorf("%s: document %d: %w", path, i+1, err)
		}
		if !strings.HasPrefix(head.APIVersion, "monitoring.coreos.com/") {
			continue
		}
		where := fmt.Sprintf("%s: %s %s", path, head.Kind, head.Metadata.Name)
		if head.APIVersion != "monitoring.coreos.com/v1" {
			return fmt.Errorf("%s: apiVersion %s is not checked (only monitoring.coreos.com/v1)", where, head.APIVersion)
		}
		switch head.Kind {
		case "ServiceMonitor":
			var sm monitoringv1.ServiceMonitor
			if err := strict(doc, &sm); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
			if len(sm.Spec.Endpoints) == 0 {
				return fmt.Errorf("%s: no endpoints: nothing would be scraped", where)
			}
			if len(sm.Spec.Selector.MatchLabels) == 0 && len(sm.Spec.Selector.MatchExpressions) == 0 {
				return fmt.Errorf("%s: empty selector", where)
			}
			for _, ep := range sm.Spec.Endpoints {
				if ep.Port == "" && ep.TargetPort == nil {
					return fmt.Errorf("%s: an endpoint names no port", where)
				}
				if ep.Interval != "" {
					if _, err := model.ParseDuration(string(ep.Interval)); err != nil {
						return fmt.Errorf("%s: endpoint interval: %w", where, err)
					}
				}
			}
		case "PrometheusRule":
			var pr monitoringv1.PrometheusRule
			if err := strict(doc, &pr); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
			if len(pr.Spec.Groups) == 0 {
				return fmt.Errorf("%s: no rule groups", where)
			}
			for _, g := range pr.Spec.Groups {
				for _, r := range g.Rules {
					name := r.Alert + r.Record
					if (r.Alert == "") == (r.Record == "") {
						return fmt.Errorf("%s: group %s: a rule needs exactly one of alert and record (%q)", where, g.Name, name)
					}
					if err := promql(r.Expr.String(), metrics); err != nil {
						return fmt.Errorf("%s: rule %s: %w", where, name, err)
					}
					if r.For != nil {
						if _, err := model.ParseDuration(string(*r.For)); err != nil {
							return fmt.Errorf("%s: rule %s: for: %w", where, name, err)
						}
					}
				}
			}
		default:
			return fmt.Errorf("%s: kind %s of monitoring.coreos.com is not checked", where, head.Kind)
		}
	}
	return nil
}

// strict decodes YAML into a typed object, failing on fields the type does not have.
func strict(doc []byte, into any) error {
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("does not match the operator's schema: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the object")
	}
	return nil
}

func splitDocuments(raw []byte) [][]byte {
	var docs [][]byte
	for _, d := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(raw), -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

func stripComments(s string) string {
	return regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(s, "")
}

// Grafana's variables, replaced by a value of their kind so the query parses as PromQL.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
	"${datasource}", "x", "$job", ".*", "$instance", ".*",
)

func checkDashboard(path string, metrics map[string]bool) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		return fmt.Errorf("%s is not valid JSON: %w", path, err)
	}
	queries := 0
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			return fmt.Errorf("%s: panel %q has no query", path, p.Title)
		}
		for _, t := range p.Targets {
			if strings.Contains(grafanaVars.Replace(t.Expr), "$") {
				return fmt.Errorf("%s: panel %q: a variable the dashboard does not define: %s", path, p.Title, t.Expr)
			}
			if err := promql(grafanaVars.Replace(t.Expr), metrics); err != nil {
				return fmt.Errorf("%s: panel %q: %w", path, p.Title, err)
			}
			queries++
		}
	}
	if queries == 0 {
		return fmt.Errorf("%s: no queries", path)
	}
	return nil
}

// promql parses an expression and records the metric names it selects.
func promql(expr string, metrics map[string]bool) error {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return fmt.Errorf("PromQL %q: %w", expr, err)
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok && vs.Name != "" {
			metrics[vs.Name] = true
		}
		return nil
	})
	return nil
}
