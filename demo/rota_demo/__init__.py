"""The example application built on rota, shipped beside the library as its own package
(the ``demo`` extra, the ``rota-demo`` command): an outreach product (brand brief to
creators) as a pipeline (:mod:`rota_demo.app`), its external pieces (a YouTube Data API
client and stand-in, brand briefs from web pages, a pluggable language model), the
end-to-end run that drives it through the cron endpoint (:mod:`rota_demo.driver`) and
its pricing table (:mod:`rota_demo.pricing`)."""
