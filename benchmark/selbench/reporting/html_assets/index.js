/* selbench index.html: a link to each results folder's leaderboard.html. */
runPage(function (D) {
  var app = document.getElementById("app");
  app.appendChild(el("h1", {text: "selbench leaderboards"}));
  app.appendChild(el("ul", {class: "index"}, D.index.map(function (e) {
    var exps = e.experiments.map(function (x) { return x[0] + " (" + x[1] + " methods)"; }).join(", ");
    return el("li", {"data-folder": e.folder}, [el("a", {href: e.href, text: e.title}), e.description ? " — " + e.description : "",
      el("div", {class: "note", text: "experiments: " + exps + " · seeds " + e.seeds.join(", ") + " · selbench " + (e.selbench || "?") +
        " · spec hash " + String(e.spec_hash || "").slice(0, 12) + (e.date ? " · run " + e.date : "")})]);
  })));
});
