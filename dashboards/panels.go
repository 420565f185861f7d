package dashboards

import (
	"errors"
	"fmt"
	"strings"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/statetimeline"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// Grafana macros and the dashboards' variables, as they appear in queries.
const (
	rateInterval = "$__rate_interval"
	jobMatch     = `job=~"$job"`
	instMatch    = `instance=~"$instance"`
	poolMatch    = `engine_type=~"$pool"`
)

// sel renders a series selector.
func sel(metric string, matchers ...string) string {
	return metric + "{" + strings.Join(matchers, ", ") + "}"
}

// rate is a per-second rate over Grafana's rate interval (at least four scrape intervals).
func rate(selector string) string { return "rate(" + selector + "[" + rateInterval + "])" }

// quantile is the q-quantile of a histogram family's bucket rates, kept apart by the by labels.
func quantile(q, family string, by string, matchers ...string) string {
	grouping := "le"
	if by != "" {
		grouping = by + ", le"
	}
	return fmt.Sprintf("histogram_quantile(%s, sum by (%s) (%s))", q, grouping, rate(sel(family+"_bucket", matchers...)))
}

// perInstance sums an SGLang scheduler gauge per instance. Series that differ only in tp_rank,
// pp_rank or moe_ep_rank are one value reported by several ranks (with
// --enable-metrics-for-all-schedulers) and are counted once; dp_rank series have their own
// pools and are added up — as basin's collector does.
func perInstance(selector string) string {
	return "sum by (instance) (max without (tp_rank, pp_rank, moe_ep_rank) (" + selector + "))"
}

// target is one query of a panel.
type target struct {
	expr, legend string
}

func datasource() common.DataSourceRef {
	return common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}
}

func query(i int, t target) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().
		RefId(string(rune('A' + i))).
		Datasource(datasource()).
		Expr(t.expr).
		LegendFormat(t.legend).
		Range()
}

func legend() *common.VizLegendOptionsBuilder {
	return common.NewVizLegendOptionsBuilder().
		ShowLegend(true).
		DisplayMode(common.LegendDisplayModeList).
		Placement(common.LegendPlacementBottom)
}

func tooltip() *common.VizTooltipOptionsBuilder {
	return common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending)
}

// timeSeries is a line chart with a legend, a shared tooltip and one query per target.
func timeSeries(title, description, unit string, span uint32, targets ...target) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(datasource()).
		Unit(unit).
		Height(8).
		Span(span).
		Legend(legend()).
		Tooltip(tooltip()).
		LineWidth(1).
		FillOpacity(0).
		ShowPoints(common.VisibilityModeNever)
	for i, t := range targets {
		p.WithTarget(query(i, t))
	}
	return p
}

// stateTimeline shows one row per series, coloured by value mappings.
func stateTimeline(title, description string, height uint32, mappings []dashboard.ValueMapping, targets ...target) *statetimeline.PanelBuilder {
	p := statetimeline.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(datasource()).
		Unit("short").
		Height(height).
		Span(24).
		Legend(legend()).
		Tooltip(tooltip()).
		Mappings(mappings).
		ShowValue(common.VisibilityModeAuto).
		MergeValues(true).
		FillOpacity(80).
		LineWidth(0)
	for i, t := range targets {
		p.WithTarget(query(i, t))
	}
	return p
}

// valueText is a value mapping: a number shown as text in a colour.
type valueText struct {
	value, text, color string
}

func valueMappings(vs ...valueText) []dashboard.ValueMapping {
	m := dashboard.ValueMap{Type: dashboard.MappingTypeValueToText, Options: map[string]dashboard.ValueMappingResult{}}
	for i, v := range vs {
		m.Options[v.value] = dashboard.ValueMappingResult{Text: cog.ToPtr(v.text), Color: cog.ToPtr(v.color), Index: cog.ToPtr(int32(i))}
	}
	return []dashboard.ValueMapping{{ValueMap: &m}}
}

// Override properties.
func unitProp(unit string) dashboard.DynamicConfigValue {
	return dashboard.DynamicConfigValue{Id: "unit", Value: unit}
}

func rightAxis(label string) []dashboard.DynamicConfigValue {
	return []dashboard.DynamicConfigValue{
		{Id: "custom.axisPlacement", Value: common.AxisPlacementRight},
		{Id: "custom.axisLabel", Value: label},
	}
}

func dashed() dashboard.DynamicConfigValue {
	return dashboard.DynamicConfigValue{Id: "custom.lineStyle", Value: common.LineStyle{
		Fill: cog.ToPtr(common.LineStyleFillDash), Dash: []float64{10, 10}}}
}

func fixedColor(color string) dashboard.DynamicConfigValue {
	return dashboard.DynamicConfigValue{Id: "color", Value: dashboard.FieldColor{
		Mode: dashboard.FieldColorModeIdFixed, FixedColor: cog.ToPtr(color)}}
}

func props(ps ...dashboard.DynamicConfigValue) []dashboard.DynamicConfigValue { return ps }

// board lays panels out and numbers them: every panel and row gets the next id, so ids are
// stable across regenerations and unique within the dashboard.
type board struct {
	b    *dashboard.DashboardBuilder
	next uint32
	errs []error
}

func newBoard(uid, title, description string, tags []string) *board {
	b := dashboard.NewDashboardBuilder(title).
		Uid(uid).
		Description(description).
		Tags(tags).
		Editable().
		Refresh("30s").
		Time("now-6h", "now").
		Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		Link(dashboard.NewDashboardLinkBuilder("basin").
			Type(dashboard.DashboardLinkTypeDashboards).
			Tags([]string{"basin"}).
			AsDropdown(false).
			IncludeVars(true).
			KeepTime(true)).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").
			Label("Data source").
			Type("prometheus"))
	return &board{b: b}
}

func (b *board) id() uint32 {
	b.next++
	return b.next
}

func (b *board) row(title string) {
	b.b.WithRow(dashboard.NewRowBuilder(title).Id(b.id()))
}

func (b *board) panel(p cog.Builder[dashboard.Panel]) {
	built, err := p.Build()
	if err != nil {
		b.errs = append(b.errs, err)
		return
	}
	built.Id = cog.ToPtr(b.id())
	b.b.WithPanel(panelValue(built))
}

func (b *board) build() (dashboard.Dashboard, error) {
	d, err := b.b.Build()
	if err = errors.Join(append(b.errs, err)...); err != nil {
		return dashboard.Dashboard{}, fmt.Errorf("build dashboard: %w", err)
	}
	return d, nil
}

// panelValue hands an already built panel to the dashboard builder.
type panelValue dashboard.Panel

func (p panelValue) Build() (dashboard.Panel, error) { return dashboard.Panel(p), nil }

// allOption selects "All" by default.
func allOption() dashboard.VariableOption {
	return dashboard.VariableOption{
		Selected: cog.ToPtr(true),
		Text:     dashboard.StringOrArrayOfString{ArrayOfString: []string{"All"}},
		Value:    dashboard.StringOrArrayOfString{ArrayOfString: []string{"$__all"}},
	}
}

// labelVariable is a multi-value query variable over label_values(selector, label), "All"
// (any value, the label absent included) by default.
func labelVariable(name, label, selector, description string) *dashboard.QueryVariableBuilder {
	q := fmt.Sprintf("label_values(%s, %s)", selector, label)
	return dashboard.NewQueryVariableBuilder(name).
		Label(strings.ToUpper(name[:1]) + name[1:]).
		Description(description).
		Datasource(datasource()).
		Query(dashboard.StringOrMap{String: cog.ToPtr(q)}).
		Definition(q).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
		Sort(dashboard.VariableSortAlphabeticalAsc).
		Multi(true).
		IncludeAll(true).
		AllValue(".*").
		Current(allOption())
}

// annotation is a Prometheus annotation: one event per run of samples of expr. The expression is
// set both as the query target (current Grafana) and at the top level (older Grafana reads it
// there).
func annotation(name, color, expr, title, tags string) *dashboard.AnnotationQueryBuilder {
	return dashboard.NewAnnotationQueryBuilder().
		Name(name).
		Datasource(datasource()).
		Enable(true).
		Hide(false).
		IconColor(color).
		Target(prometheus.NewDataqueryBuilder().RefId("Anno").Datasource(datasource()).Expr(expr).Range()).
		Expr(expr).
		TitleFormat(title).
		TagKeys(tags).
		Step("1m").
		UseValueForTime(false)
}
